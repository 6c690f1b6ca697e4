import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // One PostgreSQL per run (TEST_DATABASE_URL's or an embedded one) with a migrated template.
    globalSetup: ['test/setup/global-setup.ts'],
    pool: 'forks',
    testTimeout: 30_000,
    hookTimeout: 60_000,
    watch: false,
  },
});
