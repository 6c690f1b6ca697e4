/** A small path router under /console (the server answers index.html for every client route). */
import { createContext, useContext, useEffect, useState, type AnchorHTMLAttributes, type MouseEvent, type ReactNode } from 'react';

export const BASE = '/console';

interface Location {
  path: string;
  search: URLSearchParams;
}

function current(): Location {
  const raw = window.location.pathname.startsWith(BASE) ? window.location.pathname.slice(BASE.length) : window.location.pathname;
  const path = raw === '' ? '/' : raw.replace(/\/+$/, '') || '/';
  return { path, search: new URLSearchParams(window.location.search) };
}

const RouterContext = createContext<Location>(current());

export function navigate(to: string, replace = false): void {
  const url = `${BASE}${to}`;
  if (replace) window.history.replaceState(null, '', url);
  else window.history.pushState(null, '', url);
  window.dispatchEvent(new PopStateEvent('popstate'));
  window.scrollTo(0, 0);
}

export function RouterProvider({ children }: { children: ReactNode }) {
  const [location, setLocation] = useState(current);
  useEffect(() => {
    const update = () => setLocation(current());
    window.addEventListener('popstate', update);
    return () => window.removeEventListener('popstate', update);
  }, []);
  return <RouterContext.Provider value={location}>{children}</RouterContext.Provider>;
}

export function useLocation(): Location {
  return useContext(RouterContext);
}

/** Matches `pattern` (`/tasks/:id`) against the current path; the params or null (a malformed escape in a param matches nothing). */
export function match(pattern: string, path: string): Record<string, string> | null {
  const a = pattern.split('/').filter(Boolean);
  const b = path.split('/').filter(Boolean);
  if (a.length !== b.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < a.length; i++) {
    const p = a[i]!;
    const v = b[i]!;
    if (p.startsWith(':')) {
      try {
        params[p.slice(1)] = decodeURIComponent(v);
      } catch {
        return null; // URIError: /tasks/vid_%E0%A4%A names no task
      }
    } else if (p !== v) return null;
  }
  return params;
}

/** An anchor to a console route that navigates without reloading (and still opens in a new tab). */
export function Link({ to, children, ...rest }: { to: string; children: ReactNode } & Omit<AnchorHTMLAttributes<HTMLAnchorElement>, 'href'>) {
  const onClick = (e: MouseEvent<HTMLAnchorElement>) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(to);
  };
  return (
    <a href={`${BASE}${to}`} onClick={onClick} {...rest}>
      {children}
    </a>
  );
}
