// Static list of migrations (no filesystem scanning, so it works from tsx, tsc output and
// bundles alike). `tsx scripts/create-migration.ts <name>` regenerates this file.
import type { Migration } from 'kysely';
import * as m20261122100000 from './20261122100000-accounts-keys-groups.ts';
import * as m20261122100100 from './20261122100100-catalog.ts';
import * as m20261122100200 from './20261122100200-ledger.ts';
import * as m20261122110000 from './20261122110000-video-tasks-files.ts';
import * as m20261122120000 from './20261122120000-image-tasks.ts';
import * as m20261122231937 from './20261122231937-leased-tasks.ts';
import * as m20261122234433 from './20261122234433-request-fingerprints.ts';
import * as m20261123020000 from './20261123020000-task-wakeups.ts';
import * as m20261123100000 from './20261123100000-member-pool.ts';
import * as m20261124100000 from './20261124100000-webhooks.ts';
import * as m20261125100000 from './20261125100000-member-slots.ts';
import * as m20261125110000 from './20261125110000-file-uploads.ts';
import * as m20261126100000 from './20261126100000-config-notify.ts';
import * as m20261127100000 from './20261127100000-implied-account-fks.ts';
import * as m20261129100000 from './20261129100000-video-upstream-output.ts';
import * as m20261130100000 from './20261130100000-member-circuit.ts';
import * as m20261201100000 from './20261201100000-upstream-errors.ts';
import * as m20261201200000 from './20261201200000-account-listings.ts';
import * as m20261202100000 from './20261202100000-member-account-disabled.ts';
import * as m20261203100000 from './20261203100000-media-retention.ts';
import * as m20261204100000 from './20261204100000-provider-kinds.ts';
import * as m20261205100000 from './20261205100000-upstream-mappings.ts';
import * as m20261210100000 from './20261210100000-client-limits.ts';
import * as m20261220100000 from './20261220100000-operator-views.ts';
import * as m20261221100000 from './20261221100000-terminal-task-notify.ts';
import * as m20261226100000 from './20261226100000-spend-shards.ts';
import * as m20261227100000 from './20261227100000-files-task-index.ts';
import * as m20261228100000 from './20261228100000-image-upstream-job.ts';
import * as m20261229100000 from './20261229100000-files-orientation.ts';
import * as m20261230100000 from './20261230100000-video-unanswered-submits.ts';
import * as m20261231100000 from './20261231100000-file-tombstones.ts';
import * as m20270101100000 from './20270101100000-pending-deletes.ts';
import * as m20270102100000 from './20270102100000-credit-adjustment-keys.ts';
import * as m20270103100000 from './20270103100000-video-output-file-index.ts';
import * as m20270104100000 from './20270104100000-member-rate-limit-burst.ts';

export const migrations: Record<string, Migration> = {
  '20261122100000-accounts-keys-groups': m20261122100000,
  '20261122100100-catalog': m20261122100100,
  '20261122100200-ledger': m20261122100200,
  '20261122110000-video-tasks-files': m20261122110000,
  '20261122120000-image-tasks': m20261122120000,
  '20261122231937-leased-tasks': m20261122231937,
  '20261122234433-request-fingerprints': m20261122234433,
  '20261123020000-task-wakeups': m20261123020000,
  '20261123100000-member-pool': m20261123100000,
  '20261124100000-webhooks': m20261124100000,
  '20261125100000-member-slots': m20261125100000,
  '20261125110000-file-uploads': m20261125110000,
  '20261126100000-config-notify': m20261126100000,
  '20261127100000-implied-account-fks': m20261127100000,
  '20261129100000-video-upstream-output': m20261129100000,
  '20261130100000-member-circuit': m20261130100000,
  '20261201100000-upstream-errors': m20261201100000,
  '20261201200000-account-listings': m20261201200000,
  '20261202100000-member-account-disabled': m20261202100000,
  '20261203100000-media-retention': m20261203100000,
  '20261204100000-provider-kinds': m20261204100000,
  '20261205100000-upstream-mappings': m20261205100000,
  '20261210100000-client-limits': m20261210100000,
  '20261220100000-operator-views': m20261220100000,
  '20261221100000-terminal-task-notify': m20261221100000,
  '20261226100000-spend-shards': m20261226100000,
  '20261227100000-files-task-index': m20261227100000,
  '20261228100000-image-upstream-job': m20261228100000,
  '20261229100000-files-orientation': m20261229100000,
  '20261230100000-video-unanswered-submits': m20261230100000,
  '20261231100000-file-tombstones': m20261231100000,
  '20270101100000-pending-deletes': m20270101100000,
  '20270102100000-credit-adjustment-keys': m20270102100000,
  '20270103100000-video-output-file-index': m20270103100000,
  '20270104100000-member-rate-limit-burst': m20270104100000,
};
