import { expect } from 'vitest';
import { ApiError } from '../../server/errors.ts';
import { ProviderError } from '../../server/providers/provider-error.ts';

/** The ApiError `fn` throws (failing the test when it returns or throws something else). */
export function thrownApiError(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ApiError);
    return err as ApiError;
  }
  throw new Error('expected an ApiError');
}

/** The ProviderError `promise` rejects with (rethrowing anything else; failing the test when it resolves). */
export async function providerErrorOf(promise: Promise<unknown>): Promise<ProviderError> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof ProviderError) return err;
    throw err;
  }
  throw new Error('expected a ProviderError, got an answer');
}
