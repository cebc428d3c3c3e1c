/**
 * An EventSource that reconnects with backoff. The browser's own retry keeps no
 * backoff and gives up on any answer but 200, so every error closes the source and
 * this schedules the next try itself.
 */

export interface StreamHandlers {
  /** The stream is connected; `again` when an earlier connection was lost. */
  open(again: boolean): void;
  /** One event, its data parsed as JSON. */
  event(type: string, data: any): void;
  /** The connection failed or broke; the next try is in `delay` ms. */
  error(delay: number): void;
}

const FIRST_DELAY = 1000;
const MAX_DELAY = 60000;

export class EventStream {
  private source: EventSource | null = null;
  private timer: number | null = null;
  private delay = FIRST_DELAY;
  private wasOpen = false;
  private closed = false;

  constructor(
    private readonly url: string,
    private readonly types: string[],
    private readonly handlers: StreamHandlers
  ) {}

  get isOpen(): boolean {
    return this.source !== null && this.source.readyState === EventSource.OPEN;
  }

  start(): void {
    this.closed = false;
    this.connect();
  }

  close(): void {
    this.closed = true;
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
    this.source?.close();
    this.source = null;
  }

  private connect(): void {
    this.timer = null;
    const source = new EventSource(this.url);
    this.source = source;
    source.onopen = () => {
      this.delay = FIRST_DELAY;
      this.handlers.open(this.wasOpen);
      this.wasOpen = true;
    };
    source.onerror = () => {
      source.close();
      if (this.closed || this.source !== source) {
        return;
      }
      this.source = null;
      // Any stream that broke counts as "again": what it missed must be read.
      this.wasOpen = true;
      const delay = this.delay;
      this.delay = Math.min(this.delay * 2, MAX_DELAY);
      this.timer = window.setTimeout(() => this.connect(), delay);
      this.handlers.error(delay);
    };
    for (const type of this.types) {
      source.addEventListener(type, event => {
        let data: any;
        try {
          data = JSON.parse((event as MessageEvent).data);
        } catch {
          return;
        }
        this.handlers.event(type, data);
      });
    }
  }
}

/**
 * Runs `task` at most once per `interval()` ms: a call within the interval schedules
 * one run at its end instead, however many calls come meanwhile.
 */
export class Throttle {
  private last = -Infinity;
  private notBefore = 0;
  private timer: number | null = null;
  private running = false;
  private again = false;

  constructor(
    private readonly task: () => Promise<void>,
    private readonly interval: () => number
  ) {}

  /** Run now if allowed, else once when allowed; not within `delay` ms (Retry-After). */
  request(delay = 0): void {
    this.notBefore = Math.max(this.notBefore, Date.now() + delay);
    if (this.running) {
      this.again = true;
      return;
    }
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
    const wait = Math.max(this.last + this.interval(), this.notBefore) - Date.now();
    if (wait <= 0) {
      void this.run();
    } else {
      this.timer = window.setTimeout(() => {
        this.timer = null;
        void this.run();
      }, wait);
    }
  }

  dispose(): void {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private async run(): Promise<void> {
    this.running = true;
    this.last = Date.now();
    try {
      await this.task();
    } finally {
      this.running = false;
      if (this.again) {
        this.again = false;
        this.request();
      }
    }
  }
}
