/**
 * The one place dependencies are built: config -> db -> repositories -> services. main.ts and the
 * tests call createContext; nothing else holds a database or configuration.
 */
import type { Kysely } from 'kysely';
import type { DB } from '../generated/db.d.ts';
import type { Config } from './config.ts';
import type { Logger } from './logger.ts';
import type { Metrics } from './metrics.ts';
import { ApiKeyRepository } from './repositories/api-key.repository.ts';
import { CreditRepository } from './repositories/credit.repository.ts';
import { ModelRepository } from './repositories/model.repository.ts';
import { AuthService } from './services/auth.service.ts';
import { CreditService } from './services/credit.service.ts';
import { ModelService } from './services/model.service.ts';

export interface Services {
  auth: AuthService;
  models: ModelService;
  credits: CreditService;
}

export interface AppContext {
  config: Config;
  db: Kysely<DB>;
  log: Logger;
  metrics: Metrics;
  secretKey: Buffer;
  services: Services;
}

export function createServices(deps: { config: Config; db: Kysely<DB>; log: Logger; secretKey: Buffer }): Services {
  const { config, db, log } = deps;
  return {
    auth: new AuthService(new ApiKeyRepository(db), log, config.keyCacheTtlMs),
    models: new ModelService(new ModelRepository(db)),
    credits: new CreditService(new CreditRepository(db)),
  };
}

export function createContext(deps: { config: Config; db: Kysely<DB>; log: Logger; metrics: Metrics; secretKey: Buffer }): AppContext {
  return { ...deps, services: createServices(deps) };
}
