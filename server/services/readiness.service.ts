/** GET /readyz: ready when the database answers. */
import { ApiError } from '../errors.ts';
import type { Logger } from '../logger.ts';
import type { HealthRepository } from '../repositories/health.repository.ts';

export class ReadinessService {
  constructor(
    private readonly health: HealthRepository,
    private readonly log: Logger,
  ) {}

  async check(): Promise<void> {
    try {
      await this.health.ping();
    } catch (err) {
      this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'readiness check: database unreachable');
      throw new ApiError(503, 'not_ready', 'The database is unreachable.');
    }
  }
}
