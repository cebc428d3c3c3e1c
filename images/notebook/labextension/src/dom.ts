/** A small element builder: the panel is plain DOM, redrawn from its state. */

type Child = Node | string | null | undefined | false;

export function h(
  tag: string,
  attrs: Record<string, string | number | boolean | null | undefined> = {},
  ...children: Array<Child | Child[]>
): HTMLElement {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) {
      continue;
    }
    if (name === 'class') {
      element.className = String(value);
    } else {
      element.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(element, children);
  return element;
}

function append(parent: Node, children: Array<Child | Child[]>): void {
  for (const child of children) {
    if (Array.isArray(child)) {
      append(parent, child);
    } else if (child !== null && child !== undefined && child !== false) {
      parent.appendChild(typeof child === 'string' ? document.createTextNode(child) : child);
    }
  }
}

export function button(
  className: string,
  label: string,
  title: string,
  onClick: (event: MouseEvent) => void
): HTMLButtonElement {
  const element = h('button', { class: `dmpi-button ${className}`, title, type: 'button' }, label);
  element.addEventListener('click', onClick);
  return element as HTMLButtonElement;
}
