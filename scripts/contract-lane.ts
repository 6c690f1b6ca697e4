/**
 * The contract lane: which test files run with every request through `prism proxy --errors`, and the
 * proof that they still exercise the whole contract.
 *
 * The lane's purpose is that every operation of openapi/ (and each documented response the suite
 * reaches) goes through Prism at least once. Most http test files talk to the server directly
 * (`direct()`, `directUrl`) or only repeat operations that other files already send through Prism, so
 * the lane runs the files of test/contract-lane.json only. While it runs, the harness records every
 * request that came through Prism (test/support/http-harness.ts, MEDIAGATE_CONTRACT_RECORD); the
 * `contract` step of `npm test` then fails when
 *   - an operation of the contract was not exercised through Prism at all, or
 *   - an operation and status listed in test/contract-lane.json was not exercised.
 * Pairs the chosen files exercised beyond the list are reported, not failed.
 *
 * `tsx scripts/contract-lane.ts [--all]` runs the lane over the chosen files (or all of test/http)
 * and prints which file exercised which operation and status: to choose files, or update the list.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '..');

export interface LaneManifest {
  /** Test files (relative to the repository) the contract lane runs. */
  files: string[];
  /** operationId → the statuses (as documented: "200", "default") the files exercise through Prism. */
  exercised: Record<string, string[]>;
}

export interface ContractOperation {
  operationId: string;
  method: string;
  path: string;
  /** Documented response keys: "200", "4XX", "default". */
  responses: string[];
}

/** One request that came through Prism, as the harness records it. */
export interface LaneRecord {
  file: string;
  method: string;
  path: string;
  status: number;
}

export const manifestPath = join(root, 'test/contract-lane.json');

export function readManifest(path = manifestPath): LaneManifest {
  return JSON.parse(readFileSync(path, 'utf8')) as LaneManifest;
}

/** Every operation of the bundled contract (generated/openapi.json, what Prism reads). */
export function contractOperations(specPath = join(root, 'generated/openapi.json')): ContractOperation[] {
  const doc = JSON.parse(readFileSync(specPath, 'utf8')) as { paths: Record<string, Record<string, { operationId?: string; responses?: Record<string, unknown> }>> };
  const out: ContractOperation[] = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      if (!op || typeof op !== 'object' || !op.operationId) continue;
      out.push({ operationId: op.operationId, method: method.toUpperCase(), path, responses: Object.keys(op.responses ?? {}) });
    }
  }
  return out;
}

/** The operation a request path belongs to: literal segments win over templated ones (`/v1/videos/capabilities` over `/v1/videos/{id}`). */
export function operationFor(ops: ContractOperation[], method: string, path: string): ContractOperation | undefined {
  const segments = path.split('/');
  let best: { op: ContractOperation; literals: number } | undefined;
  for (const op of ops) {
    if (op.method !== method.toUpperCase()) continue;
    const template = op.path.split('/');
    if (template.length !== segments.length) continue;
    let literals = 0;
    const fits = template.every((t, i) => {
      if (/^\{[^}]+\}$/.test(t)) return segments[i] !== '';
      if (t !== segments[i]) return false;
      literals++;
      return true;
    });
    if (fits && (!best || literals > best.literals)) best = { op, literals };
  }
  return best?.op;
}

/** The documented response a status falls under: itself, its range ("4XX"), else "default"; undefined when undocumented. */
export function documentedResponse(op: ContractOperation, status: number): string | undefined {
  const exact = String(status);
  const range = `${exact[0]}XX`;
  return [exact, range, 'default'].find((key) => op.responses.includes(key));
}

export function readRecords(dir: string): LaneRecord[] {
  return readdirSync(dir)
    .filter((name) => name.endsWith('.jsonl'))
    .flatMap((name) => readFileSync(join(dir, name), 'utf8').split('\n').filter(Boolean).map((line) => JSON.parse(line) as LaneRecord));
}

export interface Exercised {
  /** "operationId status" → the test files that exercised it through Prism. */
  pairs: Map<string, Set<string>>;
  /** Requests through Prism that no operation of the contract matched, or answered with an undocumented status. */
  strays: string[];
}

export function exercised(ops: ContractOperation[], records: LaneRecord[]): Exercised {
  const pairs = new Map<string, Set<string>>();
  const strays = new Set<string>();
  for (const r of records) {
    const op = operationFor(ops, r.method, r.path);
    const response = op && documentedResponse(op, r.status);
    if (!op || !response) {
      strays.add(`${r.method} ${r.path} → ${r.status} (${r.file})`);
      continue;
    }
    const key = `${op.operationId} ${response}`;
    if (!pairs.has(key)) pairs.set(key, new Set());
    pairs.get(key)!.add(r.file);
  }
  return { pairs, strays: [...strays].sort() };
}

/** What the lane was required to exercise and did not (each a line for the log); empty when all of it was. */
export function missing(ops: ContractOperation[], manifest: LaneManifest, seen: Exercised): string[] {
  const problems: string[] = [];
  const seenOps = new Set([...seen.pairs.keys()].map((k) => k.split(' ')[0]));
  for (const op of ops) {
    if (!seenOps.has(op.operationId)) problems.push(`${op.operationId} (${op.method} ${op.path}) was not exercised through Prism at all`);
  }
  for (const [operationId, statuses] of Object.entries(manifest.exercised)) {
    for (const status of statuses) {
      if (!seen.pairs.has(`${operationId} ${status}`)) problems.push(`${operationId} ${status} (listed in test/contract-lane.json) was not exercised through Prism`);
    }
  }
  return problems;
}

/** The pairs exercised beyond the manifest's list. */
export function unlisted(manifest: LaneManifest, seen: Exercised): string[] {
  return [...seen.pairs.keys()].filter((key) => {
    const [operationId, status] = key.split(' ');
    return !manifest.exercised[operationId!]?.includes(status!);
  }).sort();
}

/** Checks a finished lane's records; prints what is wrong and returns whether the lane covered the contract. */
export function checkLane(recordDir: string, manifest = readManifest()): boolean {
  const ops = contractOperations();
  const seen = exercised(ops, readRecords(recordDir));
  const problems = missing(ops, manifest, seen);
  for (const stray of seen.strays) console.log(`contract lane: a request outside the contract: ${stray}`);
  const extra = unlisted(manifest, seen);
  if (extra.length > 0) console.log(`contract lane: also exercised (add to test/contract-lane.json to keep them): ${extra.join(', ')}`);
  if (problems.length > 0) {
    for (const p of problems) console.error(`contract lane: ${p}`);
    console.error('contract lane: add a test file that exercises it to test/contract-lane.json ("files"), or exercise it through client()/admin() in one of them');
    return false;
  }
  const total = Object.values(manifest.exercised).reduce((n, s) => n + s.length, 0);
  console.log(`contract lane: all ${ops.length} operations exercised through Prism, ${seen.pairs.size} operation/status pairs (${total} required)`);
  return true;
}

function main(): void {
  const all = process.argv.includes('--all');
  const manifest = readManifest();
  const dir = mkdtempSync(join(tmpdir(), 'mediagate-lane-'));
  try {
    const files = all ? ['test/http'] : manifest.files;
    spawnSync(join(root, 'node_modules/.bin/vitest'), ['run', ...files], {
      cwd: root,
      stdio: 'inherit',
      env: { ...process.env, MEDIAGATE_CONTRACT_LANE: '1', MEDIAGATE_CONTRACT_RECORD: dir },
    });
    const ops = contractOperations();
    const seen = exercised(ops, readRecords(dir));
    console.log('\noperation status → test files that exercised it through Prism');
    for (const op of ops) {
      const keys = [...seen.pairs.keys()].filter((k) => k.startsWith(`${op.operationId} `)).sort();
      if (keys.length === 0) console.log(`${op.operationId} —`);
      for (const key of keys) console.log(`${key} ${[...seen.pairs.get(key)!].sort().join(' ')}`);
    }
    for (const stray of seen.strays) console.log(`outside the contract: ${stray}`);
    const exercisedNow: Record<string, string[]> = {};
    for (const key of [...seen.pairs.keys()].sort()) {
      const [operationId, status] = key.split(' ') as [string, string];
      (exercisedNow[operationId] ??= []).push(status);
    }
    console.log(`\n"exercised" as these files have it:\n${JSON.stringify(exercisedNow)}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) main();
