/** pino JSON logger. Secrets never reach it: auth headers are redacted and bodies are not logged. */
import { pino, type Logger } from 'pino';

export type { Logger };

export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["x-api-key"]',
  'res.headers["set-cookie"]',
  '*.apiKey',
  '*.key',
  '*.credentials',
  '*.password',
];

export function createLogger(level: string, destination?: NodeJS.WritableStream): Logger {
  const options = { level, redact: { paths: REDACT_PATHS, censor: '[redacted]' }, base: { service: 'mediagate' } };
  return destination ? pino(options, destination as never) : pino(options);
}
