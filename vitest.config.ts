import { availableParallelism } from 'node:os';
import { configDefaults, defineConfig } from 'vitest/config';

/**
 * test/unit and test/http share their worker processes (isolate: false): each file there builds what
 * it uses (servers, runtimes, databases) and closes it, so importing the server's modules again for
 * every file is pure cost (test/http took 222 s of CPU with a process per file, 137 s shared; both
 * pass with their files in any order, --sequence.shuffle.files). The other folders keep a process
 * per file: they start and kill child processes and embedded PostgreSQL clusters, and would gain
 * nothing (their time goes to those processes). test/db shared too passes (shuffled with the
 * others) and costs less alone (with test/unit 140 → 110 s of CPU), but the whole run took more
 * (vitest 818 s, 1,757 s of CPU, against 750 s and 1,568 s; 28 Nov 2026): it stays apart.
 */
const shared = ['test/unit/**/*.test.ts', 'test/http/**/*.test.ts'];
const common = { pool: 'forks', testTimeout: 30_000, hookTimeout: 60_000 } as const;

export default defineConfig({
  test: {
    // One PostgreSQL per run (TEST_DATABASE_URL's or an embedded one) with a migrated template. Only
    // here, not in the projects (which would each run it): they read what it provides.
    globalSetup: ['test/setup/global-setup.ts'],
    // Most files wait on servers, processes and timers rather than compute: on a 2-core machine
    // three workers keep both cores busy while a file waits (the whole run: 924 s with two, 821 s
    // with three, 7% of the CPU idle; 28 Nov 2026), where vitest's default would run one (cores - 1).
    maxWorkers: Math.max(3, availableParallelism() - 1),
    watch: false,
    projects: [
      { test: { ...common, name: 'shared', include: shared, isolate: false } },
      { test: { ...common, name: 'isolated', include: ['test/**/*.test.ts'], exclude: [...configDefaults.exclude, ...shared] } },
    ],
  },
});
