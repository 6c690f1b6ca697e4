/**
 * Regular expressions in aggregator mappings (kit/mapping.ts) run on RE2 (re2js), through JSONata's
 * `RegexEngine` option: JSONata's timeout is checked between steps, and one native RegExp call on a
 * backtracking pattern (`/^(a+)+$/` on 29 characters took 9 s) would freeze the whole process. What
 * RE2 cannot run (backreferences, lookaround) is refused when the mapping is saved.
 */
import { describe, expect, it } from 'vitest';
import { MappingError, checkMapping, mappedInput, videoContext, type UpstreamMapping } from '../../server/providers/kit/mapping.ts';
import { videoJob } from '../support/video-job.ts';

const job = (prompt: string) => videoJob({ prompt });

const mapping = (input: string): UpstreamMapping => ({ endpoint: 'fal-ai/wan-25-preview/text-to-video', input, output: 'video.url' });
const run = (input: string, prompt: string) => mappedInput(mapping(input), videoContext(job(prompt)));

describe('regular expressions in a mapping', () => {
  it('end on a prompt made to make a backtracking engine run for ever', async () => {
    const prompt = `${'a'.repeat(20_000)}!`;
    expect(await run('{"prompt": $replace(prompt, /^(a+)+$/, "x"), "hit": $contains(prompt, /(a|aa)+$/), "m": $count($match(prompt, /^(a*)*b/))}', prompt)).toEqual({ prompt, hit: false, m: 0 });
  });

  it('keep what JSONata promises of them: groups, every match with its index, $1 in replacements, the i and m flags', async () => {
    expect(await run('{"r": $replace(prompt, /(\\w+)@(\\w+)/, "$2 at $1"), "m": $match(prompt, /b(o)(x)?/), "s": $split(prompt, /\\s*,\\s*/), "i": $contains(prompt, /ANNA/i), "ml": $contains(prompt, /^b/m)}', 'anna@home, bob, box\nbo'))
      .toEqual({
        r: 'home at anna, bob, box\nbo',
        m: [
          { match: 'bo', index: 11, groups: ['o', undefined] },
          { match: 'box', index: 16, groups: ['o', 'x'] },
          { match: 'bo', index: 20, groups: ['o', undefined] },
        ],
        s: ['anna@home', 'bob', 'box\nbo'],
        i: true,
        ml: true,
      });
    // JSONata's own refusal of a pattern that matches the empty string (D1004) still comes.
    await expect(run('{"prompt": $replace(prompt, /o*/, "-")}', 'a fox')).rejects.toThrow(/matches zero length string/);
  });

  it('count positions in UTF-16 code units, as JavaScript strings do', async () => {
    expect(await run('{"m": $match(prompt, /f\\w+/)}', '🦊 a fox')).toEqual({ m: { match: 'fox', index: 5, groups: [] } });
  });

  it('that RE2 cannot run are refused when the mapping is saved, naming the pattern', async () => {
    for (const [input, pattern] of [
      ['{"prompt": $replace(prompt, /(a)\\1/, "x")}', '/(a)\\1/'],
      ['{"prompt": $contains(prompt, /fox(?=es)/) ? prompt : "x"}', '/fox(?=es)/'],
    ]) {
      const err = await checkMapping('fal', 'video', mapping(input!)).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(MappingError);
      expect([(err as MappingError).path, (err as MappingError).message]).toEqual(['input', expect.stringContaining(`uses the regular expression ${pattern}, which RE2 cannot run`)]);
    }
  });
});
