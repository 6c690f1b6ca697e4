/**
 * An in-process cache of configuration read on the hot path (API keys, image models): each entry
 * lives `ttlMs`; concurrent misses of one key share one load; a failed load is not kept. `clear()`
 * makes this instance see an admin change at once; other instances see it within `ttlMs`.
 */
export class TtlCache<V> {
  private readonly entries = new Map<string, { value: Promise<V>; expiresAt: number }>();

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries = 10_000,
    private readonly now: () => number = Date.now,
  ) {}

  get(key: string, load: () => Promise<V>): Promise<V> {
    if (this.ttlMs <= 0) return load();
    const now = this.now();
    const hit = this.entries.get(key);
    if (hit && hit.expiresAt > now) return hit.value;
    const value = load();
    // The oldest entry makes room (a Map iterates in insertion order).
    if (!hit && this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
    const entry = { value, expiresAt: now + this.ttlMs };
    this.entries.set(key, entry);
    value.catch(() => {
      if (this.entries.get(key) === entry) this.entries.delete(key);
    });
    return value;
  }

  /** Keeps `value` for `key` for the TTL (the oldest entry makes room). */
  set(key: string, value: V): void {
    if (this.ttlMs <= 0) return;
    if (!this.entries.has(key) && this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
    this.entries.set(key, { value: Promise.resolve(value), expiresAt: this.now() + this.ttlMs });
  }

  /** Whether `key` holds a value (or a load) that has not expired. */
  has(key: string): boolean {
    const hit = this.entries.get(key);
    return hit !== undefined && hit.expiresAt > this.now() && this.ttlMs > 0;
  }

  delete(key: string): void {
    this.entries.delete(key);
  }

  clear(): void {
    this.entries.clear();
  }
}
