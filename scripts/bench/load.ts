/** Runs load-worker.ts in a worker thread and waits for its result. */
import { Worker } from 'node:worker_threads';
import type { LoadResult, LoadSpec } from './load-worker.ts';

export type { LoadResult, LoadSpec };

// tsx registers its loader on the main thread only (Node 20): a worker must register it itself
// before importing a .ts module.
const TSX_API = import.meta.resolve('tsx/esm/api');
const WORKER = new URL('./load-worker.ts', import.meta.url).href;
const BOOT = `import(${JSON.stringify(TSX_API)}).then((tsx) => { tsx.register(); return import(${JSON.stringify(WORKER)}); })`;

/** `onMeasuring` runs between warm-up and the measured window, with no request in flight (e.g. to reset counters). */
export function runLoad(spec: LoadSpec, onMeasuring: () => void = () => undefined): Promise<LoadResult> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(BOOT, { eval: true, workerData: spec });
    // The worker stops by itself; this only guards against a hung server.
    const guard = setTimeout(() => {
      void worker.terminate();
      reject(new Error('load generator did not finish in time'));
    }, spec.warmupMs + spec.durationMs + 30_000);
    worker.on('message', (msg: { type: 'warmed' } | { type: 'done'; result: LoadResult }) => {
      if (msg.type === 'warmed') {
        onMeasuring();
        worker.postMessage('go');
      } else {
        clearTimeout(guard);
        resolve(msg.result);
        void worker.terminate();
      }
    });
    worker.on('error', (err) => {
      clearTimeout(guard);
      reject(err);
    });
  });
}
