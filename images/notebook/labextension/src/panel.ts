/**
 * The sidebar panel: the user's active jobs live from the API's event stream, the
 * jobs that ended in the last 30 days, and core-hours per day over them.
 */
import { Widget } from '@lumino/widgets';

import {
  ACTIVE_STATES,
  ApiError,
  DEFAULT_SETTINGS,
  DockerMPIApi,
  HistoryRow,
  Job,
  PanelSettings,
  describeError,
  isFinal
} from './api';
import { button, h } from './dom';
import { SortOrder, coreHours, duration, matches, sortRows, when } from './format';
import { EndNotifier } from './notify';
import { coreHoursPlot } from './plot';
import { EventStream, Throttle } from './stream';

const HISTORY_DAYS = 30;
/** Rows shown at most in the history table; the plot still counts them all. */
const HISTORY_ROWS_SHOWN = 200;
/** How long a message about the user's own action stays in the status line. */
const NOTICE_MS = 10000;

export interface JobsPanelOptions {
  api: DockerMPIApi;
  openOutput(jobId: string, title: string): void;
  openFolder(path: string): Promise<unknown>;
}

interface Column<T> {
  label: string;
  key: string;
  title: string;
  cell(row: T): HTMLElement;
}

export class JobsPanel extends Widget {
  private readonly api: DockerMPIApi;
  private readonly options: JobsPanelOptions;
  private settings: PanelSettings = DEFAULT_SETTINGS;
  private readonly active = new Map<string, Job>();
  /** Full records seen (events, `GET jobs/<id>`): commands and walltimes rows lack. */
  private readonly records = new Map<string, Job>();
  /** Jobs whose record was asked for once, so none is asked for twice. */
  private readonly detailsAsked = new Set<string>();
  /** Jobs whose end was already handled (the stream reports final, then closed). */
  private readonly ended = new Set<string>();
  private history: HistoryRow[] = [];
  private stream: EventStream | null = null;
  private streamState: 'connecting' | 'open' | 'retrying' = 'connecting';
  private retryIn = 0;
  private problem: string | null = null;
  private notice: { text: string; error: boolean } | null = null;
  private noticeTimer: number | null = null;
  private query = '';
  private activeOrder: SortOrder = { key: 'job_id', descending: false };
  private historyOrder: SortOrder = { key: 'ended', descending: true };
  private ticker: number | null = null;
  private renderQueued = false;
  private readonly notifier = new EndNotifier();
  private readonly jobsRefresh: Throttle;
  private readonly historyRefresh: Throttle;

  private readonly search: HTMLInputElement;
  private readonly notifyButton: HTMLButtonElement;
  private readonly status: HTMLElement;
  private readonly activeSection: HTMLElement;
  private readonly plotSection: HTMLElement;
  private readonly historySection: HTMLElement;

  constructor(options: JobsPanelOptions) {
    super();
    this.options = options;
    this.api = options.api;
    this.id = 'dockermpi-jobs-panel';
    this.addClass('dmpi-panel');
    this.title.caption = 'MPI jobs';

    const interval = () => Math.max(1, this.settings.refresh_seconds) * 1000;
    this.jobsRefresh = new Throttle(() => this.readJobs(), interval);
    this.historyRefresh = new Throttle(() => this.readHistory(), interval);

    this.search = h('input', {
      class: 'dmpi-search jp-mod-styled',
      type: 'search',
      placeholder: 'Filter: id, name, state, command',
      'aria-label': 'Filter jobs'
    }) as HTMLInputElement;
    this.search.addEventListener('input', () => {
      this.query = this.search.value;
      this.render();
    });
    this.notifyButton = button('dmpi-notify', '', '', () => void this.askToNotify());
    this.status = h('div', { class: 'dmpi-status', 'data-stream': 'connecting' });
    this.activeSection = h('section', { class: 'dmpi-section dmpi-active' });
    this.plotSection = h('section', { class: 'dmpi-section dmpi-usage' });
    this.historySection = h('section', { class: 'dmpi-section dmpi-history' });
    this.node.append(
      h('header', { class: 'dmpi-header' }, h('h2', {}, 'MPI jobs'), this.notifyButton),
      this.search,
      this.status,
      this.activeSection,
      this.historySection,
      this.plotSection
    );
    this.render();
  }

  /** Read the settings, then the jobs, and follow the stream from then on. */
  async start(): Promise<void> {
    try {
      this.settings = await this.api.settings();
    } catch (error) {
      this.problem = `DockerMPI settings: ${describeError(error)}`;
      this.render();
    }
    this.jobsRefresh.request();
    this.historyRefresh.request();
    this.stream = new EventStream(this.api.eventsUrl(), ['state'], {
      open: again => {
        this.streamState = 'open';
        this.problem = null;
        if (again) {
          this.jobsRefresh.request();
        }
        this.render();
      },
      error: delay => {
        this.streamState = 'retrying';
        this.retryIn = Math.round(delay / 1000);
        // The stream says nothing of why it failed: one (rate-limited) call does.
        this.jobsRefresh.request();
        this.render();
      },
      event: (_type, record: Job) => this.onState(record)
    });
    this.stream.start();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.stream?.close();
    this.jobsRefresh.dispose();
    this.historyRefresh.dispose();
    this.stopTicker();
    if (this.noticeTimer !== null) {
      window.clearTimeout(this.noticeTimer);
    }
    super.dispose();
  }

  private onState(record: Job): void {
    if (!record || typeof record.job_id !== 'string') {
      return;
    }
    this.records.set(record.job_id, record);
    if (isFinal(record.state)) {
      this.active.delete(record.job_id);
      this.jobEnded(record);
    } else {
      this.active.set(record.job_id, { ...this.active.get(record.job_id), ...record });
    }
    this.render();
  }

  /** A job reached its final state: show it in the history now, read the history again. */
  private jobEnded(record: Job): void {
    if (this.ended.has(record.job_id)) {
      return;
    }
    this.ended.add(record.job_id);
    if (!this.history.some(row => row.job_id === record.job_id)) {
      this.history.push(historyRowOf(record));
    }
    this.notifier.jobEnded(record);
    this.historyRefresh.request();
  }

  private async readJobs(): Promise<void> {
    try {
      const jobs = await this.api.activeJobs();
      const before = new Set(this.active.keys());
      this.active.clear();
      for (const job of jobs) {
        this.active.set(job.job_id, { ...this.records.get(job.job_id), ...job });
        before.delete(job.job_id);
      }
      // Jobs that ended while the stream was away.
      if (before.size) {
        this.historyRefresh.request();
      }
      this.problem = null;
      void this.readDetails();
    } catch (error) {
      this.failed(error, this.jobsRefresh);
    }
    this.render();
  }

  private async readHistory(): Promise<void> {
    try {
      const since = Date.now() / 1000 - HISTORY_DAYS * 86400;
      this.history = await this.api.history(since);
      for (const row of this.history) {
        this.ended.add(row.job_id);
      }
      this.problem = null;
    } catch (error) {
      this.failed(error, this.historyRefresh);
    }
    this.render();
  }

  /** Active jobs' walltimes and commands: `GET jobs` rows lack them; one call a job. */
  private async readDetails(): Promise<void> {
    for (const id of [...this.active.keys()]) {
      if (this.records.has(id) || this.detailsAsked.has(id)) {
        continue;
      }
      this.detailsAsked.add(id);
      try {
        const record = await this.api.job(id);
        this.records.set(id, record);
        const row = this.active.get(id);
        if (row) {
          this.active.set(id, { ...record, ...row, walltime: record.walltime, cmd: record.cmd });
        }
        this.render();
      } catch (error) {
        if (error instanceof ApiError && error.status === 429) {
          this.detailsAsked.delete(id);
          return;
        }
      }
    }
  }

  private failed(error: unknown, retry: Throttle): void {
    this.problem = describeError(error);
    if (error instanceof ApiError && error.retryAfter) {
      retry.request(error.retryAfter * 1000);
    }
  }

  private say(text: string, error = false): void {
    this.notice = { text, error };
    if (this.noticeTimer !== null) {
      window.clearTimeout(this.noticeTimer);
    }
    this.noticeTimer = window.setTimeout(() => {
      this.notice = null;
      this.noticeTimer = null;
      this.render();
    }, NOTICE_MS);
    this.render();
  }

  // --- actions ----------------------------------------------------------------------

  private async cancel(job: Job, control: HTMLButtonElement): Promise<void> {
    control.disabled = true;
    this.say(`Cancelling ${job.job_id}...`);
    try {
      const record = await this.api.cancel(job.job_id);
      this.onState(record);
      this.say(record.note ? `${job.job_id}: ${record.note}` : `${job.job_id} ${record.state}`);
    } catch (error) {
      control.disabled = false;
      this.say(`Cancel ${job.job_id}: ${describeError(error)}`, true);
    }
  }

  private async resubmit(jobId: string, control: HTMLButtonElement): Promise<void> {
    control.disabled = true;
    try {
      const record = this.records.get(jobId)?.cmd ? this.records.get(jobId)! : await this.api.job(jobId);
      this.records.set(jobId, record);
      const created = await this.api.submit(resubmitRequest(record));
      this.onState(created);
      this.say(`Resubmitted ${jobId} as ${created.job_id}`);
    } catch (error) {
      this.say(`Resubmit ${jobId}: ${describeError(error)}`, true);
    } finally {
      control.disabled = false;
    }
  }

  private async openFolder(jobId: string): Promise<void> {
    const path = `/${this.settings.jobs_dir}/${jobId}`;
    try {
      await this.options.openFolder(path);
    } catch (error) {
      this.say(`Cannot open ${path}: ${describeError(error)}`, true);
    }
  }

  private async askToNotify(): Promise<void> {
    await this.notifier.ask();
    this.render();
  }

  // --- drawing ----------------------------------------------------------------------

  /** Redraw once per frame however many changes come in it. */
  private render(): void {
    if (this.renderQueued) {
      return;
    }
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      if (!this.isDisposed) {
        this.draw();
      }
    });
  }

  private draw(): void {
    this.drawStatus();
    this.drawNotifyButton();

    const active = [...this.active.values()].filter(job => this.shown(job, job.cmd));
    this.activeSection.replaceChildren(
      h('h3', {}, `Active (${active.length})`),
      active.length
        ? this.table(active, activeColumns(), this.activeOrder, job => this.activeActions(job), 'active')
        : h('p', { class: 'dmpi-empty' }, this.active.size ? 'No active job matches.' : 'No active jobs.')
    );

    const rows = this.history.filter(row => this.shown(row, this.records.get(row.job_id)?.cmd));
    const shownRows = sortRows(rows, this.historyOrder, historyValue).slice(0, HISTORY_ROWS_SHOWN);
    this.historySection.replaceChildren(
      h('h3', {}, `Ended, last ${HISTORY_DAYS} days (${rows.length})`),
      rows.length
        ? this.table(shownRows, historyColumns(), this.historyOrder, row => this.historyActions(row), 'history', true)
        : h('p', { class: 'dmpi-empty' }, this.history.length ? 'No ended job matches.' : 'No ended jobs.')
    );
    if (rows.length > HISTORY_ROWS_SHOWN) {
      this.historySection.append(
        h('p', { class: 'dmpi-empty' }, `Showing ${HISTORY_ROWS_SHOWN} of ${rows.length}.`)
      );
    }

    const total = this.history.reduce((sum, row) => sum + (row.core_hours || 0), 0);
    this.plotSection.replaceChildren(
      h('h3', {}, `Core-hours per day (${coreHours(total)} in ${HISTORY_DAYS} days)`),
      coreHoursPlot(this.history, HISTORY_DAYS)
    );

    this.updateTicker();
  }

  private drawStatus(): void {
    let text: string;
    let kind = 'info';
    if (this.notice) {
      text = this.notice.text;
      kind = this.notice.error ? 'error' : 'info';
    } else if (this.problem) {
      text = this.problem;
      kind = 'error';
    } else if (this.streamState === 'open') {
      text = `Live${this.settings.user ? ` for ${this.settings.user}` : ''}`;
    } else if (this.streamState === 'retrying') {
      text = `Event stream lost: reconnecting in ${this.retryIn} s`;
      kind = 'error';
    } else {
      text = 'Connecting...';
    }
    this.status.textContent = text;
    this.status.title = text;
    this.status.dataset.stream = this.streamState;
    this.status.dataset.kind = kind;
  }

  private drawNotifyButton(): void {
    const state = this.notifier.state();
    const labels: Record<string, [string, string]> = {
      default: ['Notify me when jobs end', 'Show a browser notification when a job ends while this tab is hidden'],
      granted: ['Notifying when jobs end', 'A browser notification comes when a job ends while this tab is hidden'],
      denied: ['Notifications blocked', "The browser's site settings block notifications"],
      unsupported: ['No notifications', 'This browser (or a page served over plain http) has no notifications']
    };
    const [label, title] = labels[state];
    this.notifyButton.textContent = label;
    this.notifyButton.title = title;
    this.notifyButton.disabled = state !== 'default';
  }

  private shown(job: Job | HistoryRow, cmd: string[] | undefined): boolean {
    return matches(this.query, [job.job_id, job.name, job.state, cmd ? cmd.join(' ') : null]);
  }

  private table<T extends Job | HistoryRow>(
    rows: T[],
    columns: Column<T>[],
    order: SortOrder,
    actions: (row: T) => HTMLElement,
    which: 'active' | 'history',
    sorted = false
  ): HTMLElement {
    const value = which === 'active' ? activeValue : historyValue;
    const list = sorted ? rows : sortRows(rows, order, value as (row: T, key: string) => unknown);
    const header = h(
      'tr',
      {},
      columns.map(column => {
        const current = order.key === column.key;
        const th = h(
          'th',
          {
            class: `dmpi-sortable${current ? ' dmpi-sorted' : ''}`,
            title: `${column.title}: click to sort`,
            'data-sort-key': column.key,
            'aria-sort': current ? (order.descending ? 'descending' : 'ascending') : 'none'
          },
          column.label,
          current ? (order.descending ? ' \u25be' : ' \u25b4') : ''
        );
        th.addEventListener('click', () => {
          const next = { key: column.key, descending: current ? !order.descending : false };
          if (which === 'active') {
            this.activeOrder = next;
          } else {
            this.historyOrder = next;
          }
          this.render();
        });
        return th;
      })
    );
    // Two lines a job, the id and buttons under the figures: a sidebar is narrow.
    const body = list.map(row =>
      h(
        'tbody',
        {
          class: 'dmpi-job',
          'data-job-id': row.job_id,
          'data-state': row.state,
          'data-user': row.user ?? ''
        },
        h('tr', { class: 'dmpi-job-figures' }, columns.map(column => column.cell(row))),
        h(
          'tr',
          { class: 'dmpi-job-more' },
          h(
            'td',
            { colspan: columns.length },
            h('span', { class: 'dmpi-id' }, row.job_id),
            h('span', { class: 'dmpi-actions' }, actions(row))
          )
        )
      )
    );
    return h('table', { class: 'dmpi-table' }, h('thead', {}, header), body);
  }

  private activeActions(job: Job): HTMLElement {
    const cancel = button('dmpi-cancel', 'Cancel', `Cancel ${job.job_id}`, () => void this.cancel(job, cancel));
    return h(
      'span',
      {},
      cancel,
      button('dmpi-output', 'Output', "Follow the job's output", () =>
        this.options.openOutput(job.job_id, job.name || job.job_id)
      )
    );
  }

  private historyActions(row: HistoryRow): HTMLElement {
    const resubmit = button('dmpi-resubmit', 'Resubmit', 'Submit this job again as it was', () =>
      void this.resubmit(row.job_id, resubmit)
    );
    return h(
      'span',
      {},
      resubmit,
      button('dmpi-output', 'Output', "The job's output", () =>
        this.options.openOutput(row.job_id, row.name || row.job_id)
      ),
      button('dmpi-folder', 'Folder', `Open ${this.settings.jobs_dir}/${row.job_id} in the file browser`, () =>
        void this.openFolder(row.job_id)
      )
    );
  }

  /** Elapsed times tick here, once a second, without a call to the API. */
  private updateTicker(): void {
    const ticking = this.node.querySelector('.dmpi-tick') !== null;
    if (ticking) {
      this.tick();
      if (this.ticker === null) {
        this.ticker = window.setInterval(() => this.tick(), 1000);
      }
    } else {
      this.stopTicker();
    }
  }

  private stopTicker(): void {
    if (this.ticker !== null) {
      window.clearInterval(this.ticker);
      this.ticker = null;
    }
  }

  private tick(): void {
    const now = Date.now() / 1000;
    this.node.querySelectorAll<HTMLElement>('.dmpi-tick').forEach(span => {
      const since = Number(span.dataset.since);
      const limit = Number(span.dataset.limit);
      span.textContent = duration(now - since);
      span.classList.toggle('dmpi-near-limit', limit > 0 && now - since > 0.9 * limit);
    });
  }
}

// --- columns ------------------------------------------------------------------------

function jobCell(job: { job_id: string; name?: string | null }): HTMLElement {
  const name = job.name || '(no name)';
  return h('td', { class: 'dmpi-job-cell' }, h('div', { class: 'dmpi-name', title: name }, name));
}

function stateBadge(state: string): HTMLElement {
  return h('span', { class: `dmpi-state dmpi-state-${state}` }, state.replace('_', ' '));
}

function activeColumns(): Column<Job>[] {
  return [
    { label: 'Job', key: 'job_id', title: 'Name and id', cell: jobCell },
    {
      label: 'State',
      key: 'state',
      title: 'State; what a queued job waits for',
      cell: job => {
        const detail =
          job.state === 'queued'
            ? [job.queue_place ? `#${job.queue_place} in queue` : null, job.waiting_for].filter(Boolean).join(', ')
            : '';
        return h(
          'td',
          {},
          stateBadge(job.state),
          detail ? h('div', { class: 'dmpi-detail', title: detail }, detail) : null
        );
      }
    },
    {
      label: 'Ranks',
      key: 'np',
      title: 'Ranks (and nodes, once placed)',
      cell: job => {
        const nodes = job.placement ? Object.keys(job.placement).length : 0;
        return h('td', { class: 'dmpi-number' }, `${job.np ?? ''}`, nodes ? h('div', { class: 'dmpi-detail' }, `${nodes} node${nodes > 1 ? 's' : ''}`) : null);
      }
    },
    {
      label: 'Time',
      key: 'time',
      title: 'Running: time run, of the walltime; queued or starting: time since submitted',
      cell: job => {
        const running = job.state === 'running' && job.started;
        const since = running ? job.started : job.submitted;
        const limit = running && job.walltime ? job.walltime : 0;
        return h(
          'td',
          { class: 'dmpi-number' },
          since ? h('span', { class: 'dmpi-tick', 'data-since': since, 'data-limit': limit }) : null,
          limit ? h('div', { class: 'dmpi-detail' }, `of ${duration(limit)}`) : null
        );
      }
    }
  ];
}

function activeValue(job: Job, key: string): unknown {
  if (key === 'time') {
    return job.started ?? job.submitted;
  }
  if (key === 'state') {
    return ACTIVE_STATES.indexOf(job.state);
  }
  return job[key];
}

function historyColumns(): Column<HistoryRow>[] {
  return [
    { label: 'Job', key: 'ended', title: 'Name and id (sorts by end time)', cell: jobCell },
    {
      label: 'State',
      key: 'state',
      title: 'Final state and exit code',
      cell: row =>
        h(
          'td',
          { title: row.reason ?? '' },
          stateBadge(row.state),
          row.exit_code !== null && row.exit_code !== undefined
            ? h('div', { class: 'dmpi-detail' }, `exit ${row.exit_code}`)
            : null
        )
    },
    {
      label: 'Wait',
      key: 'queue_wait',
      title: 'Time in the queue',
      cell: row => h('td', { class: 'dmpi-number' }, duration(row.queue_wait))
    },
    {
      label: 'Run',
      key: 'elapsed',
      title: 'Run time',
      cell: row => h('td', { class: 'dmpi-number', title: `ended ${when(row.ended)}` }, duration(row.elapsed))
    },
    {
      label: 'Core-h',
      key: 'core_hours',
      title: 'Ranks x run time, in hours',
      cell: row => h('td', { class: 'dmpi-number' }, coreHours(row.core_hours))
    }
  ];
}

function historyValue(row: HistoryRow, key: string): unknown {
  return (row as unknown as Record<string, unknown>)[key];
}

/** The accounting row of an ended record, as the API's history computes it. */
function historyRowOf(record: Job): HistoryRow {
  const submitted = record.submitted ?? Date.now() / 1000;
  const ended = record.ended ?? submitted;
  const started = record.started ?? null;
  const elapsed = started ? ended - started : 0;
  return {
    job_id: record.job_id,
    name: record.name ?? null,
    user: record.user ?? '',
    state: record.state,
    exit_code: record.exit_code ?? null,
    reason: record.reason ?? null,
    np: record.np ?? 0,
    nodes: Object.keys(record.placement ?? {}),
    submitted,
    started,
    ended,
    queue_wait: (started ?? ended) - submitted,
    elapsed,
    core_hours: ((record.np ?? 0) * elapsed) / 3600
  };
}

/**
 * A submit repeating an ended job: what its record keeps of the original submit. A
 * record has no `env`, `workdir`, `nodes` or `slots_per_node` unless the API adds
 * them; then they go too.
 */
export function resubmitRequest(record: Job): Record<string, unknown> {
  const request: Record<string, unknown> = {
    image: record.image,
    np: record.np,
    cmd: record.cmd
  };
  if (record.name) {
    request.name = record.name;
  }
  if (record.walltime) {
    // The API refuses a bare number: say seconds.
    request.walltime = typeof record.walltime === 'number' ? `${record.walltime}s` : record.walltime;
  }
  for (const key of ['env', 'workdir', 'nodes', 'slots_per_node']) {
    if (record[key] !== undefined && record[key] !== null) {
      request[key] = record[key];
    }
  }
  return request;
}
