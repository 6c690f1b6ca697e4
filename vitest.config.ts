import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // One PostgreSQL per run (TEST_DATABASE_URL's or an embedded one) with a migrated template.
    globalSetup: ['test/setup/global-setup.ts'],
    pool: 'forks',
    // Most files wait on servers, processes and timers rather than compute: on a 2-core machine two
    // workers finish the suite far sooner than vitest's default of one (cores - 1).
    maxWorkers: Math.max(2, availableParallelism() - 1),
    testTimeout: 30_000,
    hookTimeout: 60_000,
    watch: false,
  },
});
