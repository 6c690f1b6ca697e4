/** The output media of a task, opened in the page (placeholder until the admin API exposes them). */
import type { Task } from '../api.ts';

export function TaskOutputs(_props: { task: Task }) {
  return null;
}
