/** A main-area view following one job's output and state on `events?job=<id>`. */
import { Widget } from '@lumino/widgets';

import { ApiError, DockerMPIApi, Job, OutputEvent, describeError, isFinal } from './api';
import { h } from './dom';
import { EventStream } from './stream';

/** Text kept at most; older output is dropped from the top (the files keep it all). */
const MAX_CHARS = 2000000;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

export class OutputView extends Widget {
  readonly jobId: string;
  private readonly api: DockerMPIApi;
  private readonly stream: EventStream;
  /** Next byte wanted per stream: a reconnected stream sends the output from byte 0. */
  private readonly offsets = { stdout: 0, stderr: 0 };
  private chars = 0;
  private ended = false;
  private readonly stateLine: HTMLElement;
  private readonly text: HTMLElement;

  constructor(api: DockerMPIApi, jobId: string, label: string) {
    super();
    this.api = api;
    this.jobId = jobId;
    this.id = `dockermpi-output-${jobId}`;
    this.addClass('dmpi-output-view');
    this.title.label = `Output ${label}`;
    this.title.caption = `Output of DockerMPI job ${jobId}`;
    this.title.closable = true;
    this.stateLine = h('div', { class: 'dmpi-output-state', 'data-state': '' }, `${jobId}: connecting...`);
    this.text = h('pre', { class: 'dmpi-output-text', tabindex: 0 });
    this.node.append(this.stateLine, this.text);
    this.node.dataset.jobId = jobId;

    this.stream = new EventStream(api.eventsUrl(jobId), ['state', 'output', 'end'], {
      open: () => undefined,
      error: delay => void this.streamFailed(delay),
      event: (type, data) => this.onEvent(type, data)
    });
    this.stream.start();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.stream.close();
    super.dispose();
  }

  private onEvent(type: string, data: any): void {
    if (type === 'output') {
      this.append(data as OutputEvent);
    } else if (type === 'state' || type === 'end') {
      this.showState(data as Job, type === 'end');
      if (type === 'end') {
        this.ended = true;
        this.stream.close();
      }
    }
  }

  private append(event: OutputEvent): void {
    const stream = event.stream === 'stderr' ? 'stderr' : 'stdout';
    const bytes = encoder.encode(event.data);
    const start = event.offset - bytes.length;
    const have = this.offsets[stream];
    if (event.offset <= have) {
      return;
    }
    const text = start < have ? decoder.decode(bytes.subarray(have - start)) : event.data;
    this.offsets[stream] = event.offset;
    const follow = this.text.scrollTop + this.text.clientHeight >= this.text.scrollHeight - 4;
    this.text.appendChild(h('span', { class: `dmpi-${stream}` }, text));
    this.chars += text.length;
    while (this.chars > MAX_CHARS && this.text.firstChild) {
      this.chars -= this.text.firstChild.textContent?.length ?? 0;
      this.text.removeChild(this.text.firstChild);
    }
    if (follow) {
      this.text.scrollTop = this.text.scrollHeight;
    }
  }

  private showState(record: Job, last: boolean): void {
    const parts = [`${record.name ? `${record.name} ` : ''}${record.job_id}: ${record.state.replace('_', ' ')}`];
    if (isFinal(record.state)) {
      if (record.exit_code !== null && record.exit_code !== undefined) {
        parts.push(`exit code ${record.exit_code}`);
      }
      if (record.reason) {
        parts.push(record.reason);
      }
    } else if (record.state === 'queued' && record.waiting_for) {
      parts.push(`waiting for ${record.waiting_for}`);
    }
    if (last) {
      parts.push('output complete');
    }
    this.stateLine.textContent = parts.join(' \u00b7 ');
    this.stateLine.title = this.stateLine.textContent;
    this.stateLine.dataset.state = record.state;
    this.node.dataset.state = record.state;
  }

  /** The stream says nothing of why it failed: one call does (404: stop trying). */
  private async streamFailed(delay: number): Promise<void> {
    if (this.ended) {
      return;
    }
    try {
      const record = await this.api.job(this.jobId);
      this.showState(record, false);
      this.stateLine.textContent += ` \u00b7 stream lost, reconnecting in ${Math.round(delay / 1000)} s`;
    } catch (error) {
      this.stateLine.textContent = `${this.jobId}: ${describeError(error)}`;
      this.stateLine.dataset.state = 'error';
      if (error instanceof ApiError && (error.status === 404 || error.status === 403)) {
        this.stream.close();
      }
    }
  }
}
