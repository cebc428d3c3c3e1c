/** Browser notifications of jobs that end while the user looks elsewhere. */
import { Job } from './api';

export type NotifyState = 'default' | 'granted' | 'denied' | 'unsupported';

export class EndNotifier {
  /** Not `'Notification' in window` alone: plain-http pages have it but may not use it. */
  state(): NotifyState {
    if (typeof window.Notification === 'undefined' || !window.isSecureContext) {
      return 'unsupported';
    }
    return window.Notification.permission as NotifyState;
  }

  /** Ask for permission; browsers allow it only from a click. */
  async ask(): Promise<NotifyState> {
    if (this.state() === 'default') {
      await window.Notification.requestPermission();
    }
    return this.state();
  }

  jobEnded(record: Job): void {
    if (this.state() !== 'granted' || !document.hidden) {
      return;
    }
    const state = record.state.replace('_', ' ');
    const parts = [];
    if (record.exit_code !== null && record.exit_code !== undefined) {
      parts.push(`exit code ${record.exit_code}`);
    }
    if (record.reason) {
      parts.push(record.reason);
    }
    try {
      new window.Notification(`${record.name || record.job_id} ${state}`, {
        body: parts.join(': ') || record.job_id,
        tag: `dockermpi-${record.job_id}`
      });
    } catch {
      // Some browsers (Android Chrome) allow notifications from service workers only.
    }
  }
}
