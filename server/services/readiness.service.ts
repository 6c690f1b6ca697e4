/** GET /readyz: ready when the database answers in time and the process is not stopping. */
import { ApiError } from '../errors.ts';
import type { Logger } from '../logger.ts';
import type { HealthRepository } from '../repositories/health.repository.ts';

/** A probe gets its answer within this, whatever the database does (a frozen one never answers). */
export const READINESS_TIMEOUT_MS = 2_000;

export class ReadinessService {
  private draining = false;

  constructor(
    private readonly health: HealthRepository,
    private readonly log: Logger,
    private readonly timeoutMs = READINESS_TIMEOUT_MS,
  ) {}

  /** From now on not ready: the process is stopping (main.ts), so a load balancer sends nothing new. */
  drain(): void {
    this.draining = true;
  }

  async check(): Promise<void> {
    if (this.draining) throw new ApiError(503, 'not_ready', 'The server is shutting down.');
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${this.timeoutMs} ms`)), this.timeoutMs);
    });
    try {
      // The ping itself is left to finish (or fail) on its own: its connection returns to the pool then.
      await Promise.race([this.health.ping(), timeout]);
    } catch (err) {
      this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'readiness check: database unreachable');
      throw new ApiError(503, 'not_ready', 'The database is unreachable.');
    } finally {
      clearTimeout(timer);
    }
  }
}
