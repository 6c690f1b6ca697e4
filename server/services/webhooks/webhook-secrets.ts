/**
 * Each account's webhook signing secret (Standard Webhooks: `whsec_` + base64 of 32 random bytes),
 * stored encrypted with the server secret. Created on first use (the first read by the client or
 * the first delivery). A rotation makes a new secret current; the previous one keeps signing —
 * deliveries then carry two signatures — for WEBHOOK_SECRET_OVERLAP_SECONDS, so a receiver can
 * switch to the new secret without rejecting a single delivery.
 */
import { randomBytes } from 'node:crypto';
import { decryptSecret, encryptSecret } from '../../lib/secret-box.ts';
import type { WebhookRepository, WebhookSecretRow } from '../../repositories/webhook.repository.ts';

export interface WebhookSecretView {
  secret: string;
  /** When this secret became current. */
  createdAt: Date;
  /** Until when the previous secret still signs (after a rotation); null: no previous secret in use. */
  previousExpiresAt: Date | null;
}

export class WebhookSecrets {
  constructor(
    private readonly repo: WebhookRepository,
    private readonly secretKey: Buffer,
    private readonly overlapSeconds: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** The account's current secret, created on first use. */
  async get(accountId: string): Promise<WebhookSecretView> {
    return this.view(await this.row(accountId));
  }

  /** A new current secret; the previous one keeps signing for the overlap window. */
  async rotate(accountId: string): Promise<WebhookSecretView> {
    return this.view(await this.repo.rotateSecret(accountId, this.seal(newSecret()), this.overlapSeconds));
  }

  /**
   * The secrets a delivery is signed with now: the current one, then the previous one within its
   * overlap. A previous secret this server cannot open (sealed with another MEDIAGATE_SECRET_KEY:
   * the operator rotated to recover from a changed key) cannot sign and is left out; the current
   * one must open.
   */
  async signing(accountId: string): Promise<string[]> {
    const row = await this.row(accountId);
    const secrets = [this.open(row.secretCiphertext)];
    if (row.previousCiphertext && row.previousExpiresAt && row.previousExpiresAt.getTime() > this.now()) {
      try {
        secrets.push(this.open(row.previousCiphertext));
      } catch {
        // Its receivers verify with the current secret, which they are given on rotation.
      }
    }
    return secrets;
  }

  private async row(accountId: string): Promise<WebhookSecretRow> {
    return (await this.repo.findSecret(accountId)) ?? (await this.repo.createSecret(accountId, this.seal(newSecret())));
  }

  private view(row: WebhookSecretRow): WebhookSecretView {
    const previousActive = row.previousCiphertext !== null && row.previousExpiresAt !== null && row.previousExpiresAt.getTime() > this.now();
    return { secret: this.open(row.secretCiphertext), createdAt: row.rotatedAt, previousExpiresAt: previousActive ? row.previousExpiresAt : null };
  }

  private seal(secret: string): Buffer {
    return encryptSecret(this.secretKey, secret);
  }

  private open(ciphertext: Buffer): string {
    return decryptSecret(this.secretKey, ciphertext);
  }
}

function newSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}
