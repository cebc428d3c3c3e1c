/** The user's core-hours per day as a small SVG bar chart. */
import { coreHours, coreHoursPerDay } from './format';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 300;
const HEIGHT = 80;
const TOP = 12;
const BOTTOM = 14;

function svg(tag: string, attrs: Record<string, string | number>, text?: string): SVGElement {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) {
    element.setAttribute(name, String(value));
  }
  if (text !== undefined) {
    element.textContent = text;
  }
  return element;
}

export function coreHoursPlot(rows: Array<{ ended: number; core_hours: number }>, days: number): SVGElement {
  const perDay = coreHoursPerDay(rows, days);
  const peak = Math.max(...perDay.map(d => d.value), 0);
  const plot = svg('svg', {
    class: 'dmpi-plot',
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: 'img',
    'aria-label': `Core-hours per day over the last ${days} days`
  });
  const slot = WIDTH / perDay.length;
  const room = HEIGHT - TOP - BOTTOM;
  plot.appendChild(svg('line', { class: 'dmpi-plot-axis', x1: 0, x2: WIDTH, y1: HEIGHT - BOTTOM, y2: HEIGHT - BOTTOM }));
  perDay.forEach((day, i) => {
    const height = peak > 0 ? (day.value / peak) * room : 0;
    const bar = svg('rect', {
      class: 'dmpi-plot-bar',
      x: i * slot + 1,
      y: HEIGHT - BOTTOM - height,
      width: Math.max(slot - 2, 1),
      height
    });
    bar.appendChild(svg('title', {}, `${day.day}: ${coreHours(day.value)} core-hours`));
    plot.appendChild(bar);
  });
  plot.appendChild(svg('text', { class: 'dmpi-plot-label', x: 0, y: 9 }, peak > 0 ? `max ${coreHours(peak)} core-h/day` : 'no core-hours used'));
  plot.appendChild(svg('text', { class: 'dmpi-plot-label', x: 0, y: HEIGHT - 2 }, perDay[0].day.slice(5)));
  plot.appendChild(svg('text', { class: 'dmpi-plot-label', x: WIDTH, y: HEIGHT - 2, 'text-anchor': 'end' }, 'today'));
  return plot;
}
