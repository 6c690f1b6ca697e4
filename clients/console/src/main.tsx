import '@mantine/core/styles.css';
import { createTheme, MantineProvider } from '@mantine/core';
import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { App } from './App.tsx';
import { RouterProvider } from './router.tsx';
import { ErrorBoundary } from './ui.tsx';

// Shade 8 for filled elements and dark text: the default shades are too light for WCAG AA on white.
const theme = createTheme({ primaryColor: 'blue', primaryShade: 8, fontFamily: 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif' });

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <MantineProvider theme={theme} defaultColorScheme="light">
      <RouterProvider>
        <ErrorBoundary>
          <App />
        </ErrorBoundary>
      </RouterProvider>
    </MantineProvider>
  </StrictMode>,
);
