/**
 * An upstream's job status vocabulary as the three states the task engine knows. Each adapter
 * declares its words once (`queued | running | succeeded | failed | expired | cancelled` for Ark,
 * `submitted | processing | succeed | failed` for Kling); a word it did not declare is a
 * retryable error — the poll is asked again later rather than a guess made.
 */
import { ProviderError } from '../provider-error.ts';

export type JobState = 'running' | 'succeeded' | 'failed';

export interface StatusVocabulary {
  running: readonly string[];
  succeeded: readonly string[];
  failed: readonly string[];
}

/** A function from the upstream's status value to a JobState (case-sensitive, as upstreams send them). */
export function jobStatus(vocabulary: StatusVocabulary, what: string): (status: unknown) => JobState {
  const states = new Map<string, JobState>();
  for (const state of ['running', 'succeeded', 'failed'] as const) for (const word of vocabulary[state]) states.set(word, state);
  return (status) => {
    const state = typeof status === 'string' ? states.get(status) : undefined;
    if (!state) throw new ProviderError('retryable', `the upstream answered an unknown ${what} status '${String(status)}'`);
    return state;
  };
}
