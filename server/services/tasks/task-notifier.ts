/**
 * Tells the task engines that work became due (a task was created), so that they claim it now
 * instead of at their next periodic claim (webhook deliveries count as a kind of task). Built once; engines subscribe when they start.
 */
export type TaskKindName = 'video' | 'image' | 'webhook';

export class TaskNotifier {
  private readonly listeners = new Set<(kind: TaskKindName) => void>();

  notify(kind: TaskKindName): void {
    for (const listener of this.listeners) listener(kind);
  }

  /** Returns the unsubscribe function. */
  subscribe(listener: (kind: TaskKindName) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}
