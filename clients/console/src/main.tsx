import '@mantine/core/styles.css';
import { createTheme, MantineProvider, type CSSVariablesResolver } from '@mantine/core';
import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { App } from './App.tsx';
import { RouterProvider } from './router.tsx';
import { ErrorBoundary } from './ui.tsx';

// Shade 8 for filled elements and dark text: the default shades are too light for WCAG AA on white.
const theme = createTheme({ primaryColor: 'blue', primaryShade: 8, fontFamily: 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif' });

// Two light-scheme colours the shade does not reach, darkened for WCAG AA (4.5:1): dimmed text (input
// descriptions) is gray 6, 3.32:1 on white; red outline buttons (Revoke, Disable) are red 8, 4.28:1 on
// a striped table row. Gray 7 and red 9 are 8:1 and over 5:1.
const cssVariablesResolver: CSSVariablesResolver = () => ({
  variables: {},
  light: { '--mantine-color-dimmed': 'var(--mantine-color-gray-7)', '--mantine-color-red-outline': 'var(--mantine-color-red-9)' },
  dark: {},
});

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <MantineProvider theme={theme} cssVariablesResolver={cssVariablesResolver} defaultColorScheme="light">
      <RouterProvider>
        <ErrorBoundary>
          <App />
        </ErrorBoundary>
      </RouterProvider>
    </MantineProvider>
  </StrictMode>,
);
