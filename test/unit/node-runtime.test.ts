import { describe, expect, it } from 'vitest';
import { applyV8Workarounds, nodeRuntimeWarning, v8WorkaroundFlags } from '../../server/lib/node-runtime.ts';

describe('the Node.js runtime warning', () => {
  it('warns on Node 20 and earlier, naming the version, the V8 flag it runs with on 20 and what to run instead', () => {
    expect(nodeRuntimeWarning('20.20.2', ['--no-turbo-allocation-folding'])).toMatch(/^Node\.js 20\.20\.2 is past its end of life.*SIGSEGV.*it runs with --no-turbo-allocation-folding.*; run it on Node\.js 22 or 24$/);
    expect(nodeRuntimeWarning('20.20.2', [])).toMatch(/^Node\.js 20\.20\.2 is past its end of life[^;]*\(docs\/BENCHMARKS\.md\); run it on Node\.js 22 or 24$/);
    expect(nodeRuntimeWarning('18.20.0', [])).toMatch(/^Node\.js 18\.20\.0 is past its end of life.*SIGSEGV[^;]*\(docs\/BENCHMARKS\.md\); run it on Node\.js 22 or 24$/);
  });

  it('says nothing on Node 22 and later', () => {
    expect(nodeRuntimeWarning('22.23.3')).toBeUndefined();
    expect(nodeRuntimeWarning('24.21.0')).toBeUndefined();
    expect(nodeRuntimeWarning('25.0.0')).toBeUndefined();
  });
});

describe('the V8 workaround on Node 20', () => {
  it('turns TurboFan allocation folding off on Node 20 only', () => {
    expect(v8WorkaroundFlags('20.20.2')).toEqual(['--no-turbo-allocation-folding']);
    expect(v8WorkaroundFlags('18.20.0')).toEqual([]);
    expect(v8WorkaroundFlags('22.23.3')).toEqual([]);
    expect(v8WorkaroundFlags('24.21.0')).toEqual([]);
  });

  it('sets the flags on the running process (what the start calls first), and the warning names them', () => {
    expect(applyV8Workarounds()).toEqual(v8WorkaroundFlags());
    if (v8WorkaroundFlags().length > 0) expect(nodeRuntimeWarning()).toContain(`it runs with ${v8WorkaroundFlags().join(' ')}`);
  });
});
