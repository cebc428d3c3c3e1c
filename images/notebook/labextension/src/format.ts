/** Plain text for the panel's cells: durations, times, and the search and sort rules. */

/** `42s`, `5m03s`, `2h05m`, `3d04h`. */
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '';
  }
  const s = Math.max(0, Math.floor(seconds));
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h${pad(Math.floor((s % 3600) / 60))}m`;
  }
  return `${Math.floor(s / 86400)}d${pad(Math.floor((s % 86400) / 3600))}h`;
}

/** Local date and time of a Unix time, to the minute. */
export function when(epoch: number | null | undefined): string {
  if (!epoch) {
    return '';
  }
  const d = new Date(epoch * 1000);
  const pad = (n: number) => String(n).padStart(2, '0');
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}`
  );
}

export function coreHours(value: number | null | undefined): string {
  if (value === null || value === undefined) {
    return '';
  }
  return value < 10 ? value.toFixed(2) : value.toFixed(1);
}

/** Whether any of `fields` holds every word of `query` (case-insensitive). */
export function matches(query: string, fields: Array<string | null | undefined>): boolean {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) {
    return true;
  }
  const text = fields
    .filter(f => f)
    .join(' ')
    .toLowerCase();
  return words.every(word => text.includes(word));
}

export interface SortOrder {
  key: string;
  descending: boolean;
}

/** Rows sorted by `order.key` (numbers as numbers, missing values last). */
export function sortRows<T>(rows: T[], order: SortOrder, value: (row: T, key: string) => unknown): T[] {
  const sign = order.descending ? -1 : 1;
  return [...rows].sort((a, b) => {
    const x = value(a, order.key);
    const y = value(b, order.key);
    const xMissing = x === null || x === undefined || x === '';
    const yMissing = y === null || y === undefined || y === '';
    if (xMissing || yMissing) {
      return xMissing === yMissing ? 0 : xMissing ? 1 : -1;
    }
    if (typeof x === 'number' && typeof y === 'number') {
      return sign * (x - y);
    }
    return sign * String(x).localeCompare(String(y), undefined, { numeric: true });
  });
}

/** A local calendar day as `YYYY-MM-DD`. */
export function dayKey(date: Date): string {
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`;
}

/** Core-hours per local day over the `days` days up to today, oldest first. */
export function coreHoursPerDay(
  rows: Array<{ ended: number; core_hours: number }>,
  days: number,
  now: Date = new Date()
): Array<{ day: string; value: number }> {
  const totals = new Map<string, number>();
  const out: Array<{ day: string; value: number }> = [];
  for (let i = days - 1; i >= 0; i--) {
    const d = new Date(now.getFullYear(), now.getMonth(), now.getDate() - i);
    totals.set(dayKey(d), 0);
  }
  for (const row of rows) {
    const key = dayKey(new Date(row.ended * 1000));
    if (totals.has(key)) {
      totals.set(key, (totals.get(key) ?? 0) + (row.core_hours || 0));
    }
  }
  totals.forEach((value, day) => out.push({ day, value }));
  return out;
}
