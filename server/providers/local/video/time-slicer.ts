/**
 * Time slicing for the renderer's pixel loops. Local clips are rendered on the gateway's own event
 * loop, and painting a 1080p frame is about 20 ms of JavaScript (fitting an input image or the text
 * overlay more, once per clip): run in one go, it would hold up every other request for that long.
 * The loops check due() between rows; once a slice's budget is spent they give the event loop one
 * turn. (A worker thread would take the work off the loop entirely, but it needs a second entry
 * path for the TypeScript sources the tests run and the built JavaScript production runs, sharp
 * and FFmpeg loaded in another thread, and abort and errors carried across; slices meet the
 * target with an await in each loop, and the bytes written do not change.)
 */
import { performance } from 'node:perf_hooks';

/**
 * Longest stretch of rendering between two turns of the event loop. Well under the 10 ms a turn
 * may take, leaving room for what else runs in it (encoder callbacks, garbage collection), and
 * large next to the cost of a turn (a few microseconds when the loop is idle).
 */
export const SLICE_BUDGET_MS = 3;

/**
 * Hands the event loop back once `budgetMs` of work have run since its last turn. Renders that
 * share one slicer share its budget: they all wait for the same turn, and the first to run after it
 * spends the budget (a slicer each would let every waiting render run a full slice back to back in
 * one turn).
 */
export class TimeSlicer {
  private sliceStart = performance.now();
  private turn: Promise<void> | null = null;
  /** Turns given to the event loop so far. */
  turns = 0;

  constructor(private readonly budgetMs = SLICE_BUDGET_MS) {}

  /**
   * True once the slice's budget is spent; the caller then gives the loop its turn with
   * `await slicer.nextTurn()`. Checked between rows, so it is a clock read and nothing else (an
   * `await` at every row, even of nothing, costs a promise and a microtask a row: garbage that
   * brings the collector's pauses sooner).
   */
  due(): boolean {
    return performance.now() - this.sliceStart >= this.budgetMs;
  }

  /**
   * Settles after one turn of the event loop (setImmediate: after the I/O that is waiting; a timer
   * would add a 1 ms floor), and starts the next slice. Callers waiting at once share the turn.
   */
  nextTurn(): Promise<void> {
    this.turn ??= new Promise((resolve) =>
      setImmediate(() => {
        this.turn = null;
        this.turns++;
        this.sliceStart = performance.now();
        resolve();
      }),
    );
    return this.turn;
  }
}
