import { describe, expect, it } from 'vitest';
import { nodeRuntimeWarning } from '../../server/lib/node-runtime.ts';

describe('the Node.js runtime warning', () => {
  it('warns on Node 20 and earlier, naming the version and what to run instead', () => {
    expect(nodeRuntimeWarning('20.20.2')).toMatch(/^Node\.js 20\.20\.2 is past its end of life.*SIGSEGV.*Node\.js 22 or 24$/);
    expect(nodeRuntimeWarning('18.20.0')).toMatch(/^Node\.js 18\.20\.0/);
  });

  it('says nothing on Node 22 and later', () => {
    expect(nodeRuntimeWarning('22.23.3')).toBeUndefined();
    expect(nodeRuntimeWarning('24.21.0')).toBeUndefined();
    expect(nodeRuntimeWarning('25.0.0')).toBeUndefined();
  });
});
