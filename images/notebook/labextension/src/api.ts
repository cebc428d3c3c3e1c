/**
 * Calls to DockerMPI's user API through the notebook server's `dockermpi` extension,
 * which forwards them with the server's token: the browser never holds that token.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** States a job may still leave. */
export const ACTIVE_STATES = ['queued', 'starting', 'running'];
/** States a job ends in. */
export const FINAL_STATES = ['succeeded', 'failed', 'cancelled', 'timed_out'];

export function isFinal(state: string): boolean {
  return FINAL_STATES.includes(state);
}

/** A job as `GET jobs` lists it, or its full record (events, `GET jobs/<id>`). */
export interface Job {
  job_id: string;
  name?: string | null;
  user?: string;
  state: string;
  np?: number;
  placement?: Record<string, unknown> | null;
  submitted?: number;
  started?: number | null;
  ended?: number | null;
  reason?: string | null;
  waiting_for?: string | null;
  queue_place?: number | null;
  exit_code?: number | null;
  walltime?: number;
  image?: string;
  cmd?: string[];
  [field: string]: unknown;
}

/** An ended job as `GET history` gives it. */
export interface HistoryRow {
  job_id: string;
  name: string | null;
  user: string;
  state: string;
  exit_code: number | null;
  reason: string | null;
  np: number;
  nodes: string[];
  submitted: number;
  started: number | null;
  ended: number;
  queue_wait: number;
  elapsed: number;
  core_hours: number;
}

export interface OutputEvent {
  job_id: string;
  stream: 'stdout' | 'stderr';
  data: string;
  offset: number;
}

export interface PanelSettings {
  refresh_seconds: number;
  user: string;
  jobs_dir: string;
}

export const DEFAULT_SETTINGS: PanelSettings = {
  refresh_seconds: 30,
  user: '',
  jobs_dir: 'mpi-jobs'
};

/** An answer other than 2xx, with the API's reason when it gave one. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly retryAfter: number | null = null
  ) {
    super(message);
  }
}

export class DockerMPIApi {
  private readonly server = ServerConnection.makeSettings();

  /** The same-origin URL of an API path: cookies authenticate an EventSource on it. */
  apiUrl(path: string, query: Record<string, string | number> = {}): string {
    const url = URLExt.join(this.server.baseUrl, 'dockermpi/api/v1', path);
    return url + URLExt.objectToQueryString(query);
  }

  async settings(): Promise<PanelSettings> {
    const url = URLExt.join(this.server.baseUrl, 'dockermpi/settings');
    const found = await this.fetchJson<Partial<PanelSettings>>(url, { method: 'GET' });
    return { ...DEFAULT_SETTINGS, ...found };
  }

  activeJobs(): Promise<Job[]> {
    return this.allPages<Job>('jobs', { state: ACTIVE_STATES.join(',') });
  }

  job(jobId: string): Promise<Job> {
    return this.get<Job>(`jobs/${encodeURIComponent(jobId)}`);
  }

  history(since: number): Promise<HistoryRow[]> {
    return this.allPages<HistoryRow>('history', { since: Math.floor(since) });
  }

  submit(request: Record<string, unknown>): Promise<Job> {
    return this.post<Job>('jobs', request);
  }

  cancel(jobId: string): Promise<Job> {
    return this.post<Job>(`jobs/${encodeURIComponent(jobId)}/cancel`, {});
  }

  /**
   * An event stream's URL. The hub's login to this server takes a cookie-borne request
   * that is no page load only with its XSRF token, and an EventSource can send no
   * header: the token goes in the query (`_xsrf`, which the server extension keeps
   * from the API).
   */
  eventsUrl(jobId?: string): string {
    const query: Record<string, string> = jobId ? { job: jobId } : {};
    const xsrf = document.cookie.match(/(?:^|; )_xsrf=([^;]*)/);
    if (xsrf) {
      query._xsrf = decodeURIComponent(xsrf[1]);
    }
    return this.apiUrl('events', query);
  }

  /**
   * Every row of a paged list (`{jobs, next}`): the API gives at most the site's
   * `page_jobs` rows a call, oldest first, and `next` names where the following page
   * starts. Each job id follows the last, so the pages end.
   */
  private async allPages<T>(path: string, query: Record<string, string | number>): Promise<T[]> {
    const rows: T[] = [];
    let after: string | null = null;
    do {
      const page: { jobs: T[]; next?: string | null } = await this.get(
        path,
        after === null ? query : { ...query, after }
      );
      rows.push(...page.jobs);
      after = page.next ?? null;
    } while (after !== null);
    return rows;
  }

  get<T>(path: string, query: Record<string, string | number> = {}): Promise<T> {
    return this.fetchJson<T>(this.apiUrl(path, query), { method: 'GET' });
  }

  post<T>(path: string, body: unknown): Promise<T> {
    return this.fetchJson<T>(this.apiUrl(path), {
      method: 'POST',
      body: JSON.stringify(body),
      headers: { 'Content-Type': 'application/json' }
    });
  }

  private async fetchJson<T>(url: string, init: RequestInit): Promise<T> {
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.server);
    } catch (error) {
      throw new ApiError(0, `the notebook server does not answer (${String(error)})`);
    }
    const text = await response.text();
    let body: any = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    if (!response.ok) {
      const retry = Number(response.headers.get('Retry-After'));
      const reason =
        body && typeof body.error === 'string' ? body.error : response.statusText || 'error';
      throw new ApiError(response.status, reason, Number.isFinite(retry) && retry > 0 ? retry : null);
    }
    return body as T;
  }
}

/** One line for the panel's status from any error a call raised. */
export function describeError(error: unknown): string {
  if (error instanceof ApiError) {
    if (error.status === 0) {
      return error.message;
    }
    const retry = error.retryAfter ? `, retry in ${error.retryAfter} s` : '';
    return `${error.message} (HTTP ${error.status}${retry})`;
  }
  return String(error);
}
