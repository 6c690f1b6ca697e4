import { expect } from 'vitest';
import { ApiError } from '../../server/errors.ts';

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
