/**
 * The console's accessibility check, run in the browser: every form control has an accessible name
 * (a label, aria-label or aria-labelledby), and text has WCAG AA contrast (4.5:1, 3:1 for large
 * text) against its nearest opaque background (relative luminance). Over the whole document (a
 * `Page`: an open modal included) or one element and what it holds (a `Locator`).
 */
import type { Locator, Page } from 'playwright-core';

/* eslint-disable @typescript-eslint/no-explicit-any -- the check runs in the browser: the DOM's types are not in the project's lib */
type DomElement = any;
declare const document: any;
declare const getComputedStyle: (el: DomElement) => any;
declare const CSS: { escape(s: string): string };
declare const NodeFilter: { SHOW_TEXT: number };
/* eslint-enable @typescript-eslint/no-explicit-any */

/** Unlabelled controls and text below AA contrast in what `target` shows, one line each. */
export function accessibilityProblems(target: Page | Locator): Promise<string[]> {
  // Self-contained: Playwright sends its source to the page.
  const check = (root?: DomElement): string[] => {
    const scope = root ?? document;
    const out: string[] = [];
    for (const el of scope.querySelectorAll('input:not([type=hidden]), select, textarea, button') as DomElement[]) {
      if (el.closest('[aria-hidden=true]') || el.offsetParent === null) continue;
      const id = el.id;
      const named =
        el.getAttribute('aria-label') ||
        el.getAttribute('aria-labelledby') ||
        (id && document.querySelector(`label[for="${CSS.escape(id)}"]`)) ||
        el.closest('label') ||
        (el.tagName === 'BUTTON' && el.textContent?.trim());
      if (!named) out.push(`unlabelled ${el.tagName.toLowerCase()} ${el.outerHTML.slice(0, 80)}`);
    }
    const rgb = (c: string) => (c.match(/[\d.]+/g) ?? []).map(Number);
    const lum = ([r, g, b]: number[]) =>
      [r!, g!, b!].map((v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)).reduce((a, v, i) => a + v * [0.2126, 0.7152, 0.0722][i]!, 0);
    const background = (el: DomElement | null): number[] => {
      for (let e = el; e; e = e.parentElement) {
        const c = rgb(getComputedStyle(e).backgroundColor);
        if (c.length >= 3 && (c.length < 4 || c[3]! > 0.9)) return c;
      }
      return [255, 255, 255];
    };
    const walker = document.createTreeWalker(root ?? document.body, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el || !n.textContent?.trim() || el.closest('svg, [aria-hidden=true], button:disabled, [data-disabled]')) continue;
      const style = getComputedStyle(el);
      if (style.visibility === 'hidden' || el.getClientRects().length === 0 || Number(style.opacity) < 1) continue;
      const fg = rgb(style.color);
      const [l1, l2] = [lum(fg), lum(background(el))].sort((a, b) => b - a) as [number, number];
      const ratio = (l1 + 0.05) / (l2 + 0.05);
      const large = parseFloat(style.fontSize) >= 24 || (parseFloat(style.fontSize) >= 18.66 && Number(style.fontWeight) >= 700);
      if (ratio < (large ? 3 : 4.5)) out.push(`contrast ${ratio.toFixed(2)} "${n.textContent.trim().slice(0, 40)}" (${style.color})`);
    }
    return out;
  };
  return 'goto' in target ? target.evaluate(check) : target.evaluate(check);
}
