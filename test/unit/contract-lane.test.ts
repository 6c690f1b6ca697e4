/**
 * The contract lane's list (test/contract-lane.json) against the contract, and the check the
 * `contract` step of `npm test` runs on what went through Prism (scripts/contract-lane.ts): an
 * operation added to openapi/ must be listed (and so exercised through Prism by a file of the lane),
 * each listed status must be one the operation documents, each listed file must exist.
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { checkLane, contractOperations, documentedResponse, exercised, missing, operationFor, readManifest, unlisted, type LaneRecord } from '../../scripts/contract-lane.ts';

const root = join(import.meta.dirname, '../..');
const manifest = readManifest();
const ops = contractOperations();

describe('test/contract-lane.json', () => {
  it('lists existing http test files, each once', () => {
    expect(manifest.files.length).toBeGreaterThan(0);
    expect(new Set(manifest.files).size).toBe(manifest.files.length);
    for (const file of manifest.files) {
      expect(file, file).toMatch(/^test\/http\/[\w-]+\.test\.ts$/);
      expect(existsSync(join(root, file)), file).toBe(true);
    }
  });

  it('lists every operation of the contract with at least one status', () => {
    const unlistedOps = ops.filter((op) => !(manifest.exercised[op.operationId]?.length)).map((op) => op.operationId);
    expect(unlistedOps).toEqual([]);
  });

  it('lists only operations of the contract, and statuses they document', () => {
    for (const [operationId, statuses] of Object.entries(manifest.exercised)) {
      const op = ops.find((o) => o.operationId === operationId);
      expect(op, `${operationId} is not an operation of the contract`).toBeDefined();
      for (const status of statuses) expect(op!.responses, `${operationId} ${status}`).toContain(status);
    }
  });
});

describe('the lane check', () => {
  const record = (method: string, path: string, status: number, file = 'test/http/a.test.ts'): LaneRecord => ({ file, method, path, status });

  it('maps a request to its operation, literal segments before templated ones', () => {
    expect(operationFor(ops, 'GET', '/v1/videos/capabilities')?.operationId).toBe('getVideoCapabilities');
    expect(operationFor(ops, 'GET', '/v1/videos/video_123')?.operationId).toBe('getVideo');
    expect(operationFor(ops, 'GET', '/v1/files/file_1/content')?.operationId).toBe('getFileContent');
    expect(operationFor(ops, 'POST', '/v1/videos')?.operationId).toBe('createVideoLegacyPath');
    expect(operationFor(ops, 'DELETE', '/v1/videos')).toBeUndefined();
    expect(operationFor(ops, 'GET', '/v1/videos/')).toBeUndefined();
  });

  it('counts a status under its documented response, default included', () => {
    const legacy = ops.find((o) => o.operationId === 'createVideoLegacyPath')!;
    expect(documentedResponse(legacy, 404)).toBe('404');
    expect(documentedResponse(legacy, 418)).toBe('default');
    expect(documentedResponse(ops.find((o) => o.operationId === 'getHealth')!, 500)).toBeUndefined();
  });

  it('fails for an operation not exercised at all and for a listed status not exercised; reports extra ones', () => {
    const seen = exercised(ops, [record('GET', '/healthz', 200), record('GET', '/v1/models', 200), record('GET', '/v1/models', 401), record('GET', '/nowhere', 200)]);
    expect(seen.strays).toEqual(['GET /nowhere → 200 (test/http/a.test.ts)']);
    const problems = missing(ops, { files: [], exercised: { getHealth: ['200'], listModels: ['200', '403'] } }, seen);
    expect(problems).toContain('listModels 403 (listed in test/contract-lane.json) was not exercised through Prism');
    expect(problems).toContain('getReadiness (GET /readyz) was not exercised through Prism at all');
    expect(problems.filter((p) => p.startsWith('getHealth') || p.startsWith('listModels 200'))).toEqual([]);
    expect(problems).toHaveLength(1 + ops.length - 2);
    expect(unlisted({ files: [], exercised: { getHealth: ['200'], listModels: ['200', '403'] } }, seen)).toEqual(['listModels 401']);
  });

  it('passes when the records exercise every listed status', () => {
    const all = Object.entries(manifest.exercised).flatMap(([operationId, statuses]) => {
      const op = ops.find((o) => o.operationId === operationId)!;
      const path = op.path.replace(/\{[^}]+\}/g, 'x');
      return statuses.map((s) => record(op.method, path, s === 'default' ? 599 : Number(s)));
    });
    expect(missing(ops, manifest, exercised(ops, all))).toEqual([]);
  });

  it('checkLane reads the records of a directory and fails what they miss', () => {
    const dir = mkdtempSync(join(tmpdir(), 'mediagate-lane-test-'));
    const log = vi.spyOn(console, 'log').mockImplementation(() => {});
    const error = vi.spyOn(console, 'error').mockImplementation(() => {});
    try {
      writeFileSync(join(dir, '1.jsonl'), `${JSON.stringify(record('GET', '/healthz', 200))}\n`);
      expect(checkLane(dir, { files: [], exercised: { getHealth: ['200'] } })).toBe(false);
      expect(error.mock.calls.flat().join('\n')).toContain('getReadiness (GET /readyz) was not exercised through Prism at all');
    } finally {
      log.mockRestore();
      error.mockRestore();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
