/**
 * `POST /v1/webhooks/test`: a signed test event sent at once to a URL the developer gives, so a
 * receiver can be checked before a real task ends. The event is signed with the account's secrets
 * and sent as real deliveries are (`sendSignedWebhook`), through the same target rules (public
 * https; with ALLOW_PRIVATE_TARGETS also private hosts and http:// to this machine). Its body is a
 * `VideoTask` as a real event carries, of a task that does not exist (`vid_test_…`, model
 * `webhook-test`): nothing is created, charged or stored, and the answer says what the receiver did.
 *
 * Each test holds its request and an outbound connection until the receiver answers or
 * WEBHOOK_TIMEOUT_MS runs out, so the tests in flight are capped on each instance: a few per API
 * key (`429 too_many_in_flight`, the key's own excess) and a few dozen in all (`503 server_busy`);
 * a refused test sends nothing. The key's requests per minute are taken before the body is read
 * (http/request-rate.ts), as for a generation.
 */
import type { components } from '../../../generated/api.d.ts';
import { ApiError, returningRateToken } from '../../errors.ts';
import { IN_FLIGHT_RETRY_AFTER_SECONDS } from '../limits/client-limits.ts';
import { newId } from '../../lib/ids.ts';
import { Semaphore } from '../../lib/semaphore.ts';
import { OutboundUrlError, parseOutboundUrl } from '../../lib/outbound-url.ts';
import type { Logger } from '../../logger.ts';
import type { WebhookSecrets } from './webhook-secrets.ts';
import { sendSignedWebhook, type SendOptions, type SendOutcome } from './webhook-send.ts';

type VideoTask = components['schemas']['VideoTask'];
export type TestEventType = 'video.completed' | 'video.failed';

/** Test events one API key may have in flight at once on an instance. */
export const TESTS_IN_FLIGHT_PER_KEY = 2;
/** Test events in flight at once on an instance, of all keys together. */
export const TESTS_IN_FLIGHT_TOTAL = 32;

/** Who sends a test event: its in-flight cap is the key's. */
export interface TestCaller {
  apiKeyId: string;
  accountId: string;
}

export interface WebhookTestResult extends SendOutcome {
  webhookId: string;
  eventType: TestEventType;
  taskId: string;
}

export class WebhookTester {
  constructor(
    private readonly deps: {
      secrets: WebhookSecrets;
      log: Logger;
      /** Base of the example `video_url` (it names no file: a download of it is a 404). */
      publicBaseUrl: string;
      send: Omit<SendOptions, 'signal'>;
    },
  ) {}

  /** Test events in flight per API key id (keys with none are not kept). */
  private readonly perKey = new Map<string, number>();
  private readonly total = new Semaphore(TESTS_IN_FLIGHT_TOTAL);

  async send(caller: TestCaller, url: string, eventType: TestEventType): Promise<WebhookTestResult> {
    try {
      parseOutboundUrl(url, { allowPrivate: this.deps.send.allowPrivate });
    } catch (err) {
      if (!(err instanceof OutboundUrlError)) throw err;
      const which = this.deps.send.allowPrivate ? 'an https URL (or http:// to this machine)' : 'a public https URL';
      throw new ApiError(400, 'invalid_callback_url', `url must be ${which}: ${err.message}.`, 'url');
    }
    const release = this.take(caller.apiKeyId);
    try {
      const { accountId } = caller;
      const webhookId = newId('msg');
      const task = exampleTask(eventType, this.deps.publicBaseUrl);
      const outcome = await sendSignedWebhook(url, webhookId, JSON.stringify(task), await this.deps.secrets.signing(accountId), this.deps.send);
      this.deps.log.info({ accountId, webhookId, statusCode: outcome.statusCode, errorClass: outcome.errorClass, latencyMs: outcome.latencyMs }, 'webhook test event sent');
      return { ...outcome, webhookId, eventType, taskId: task.id };
    } finally {
      release();
    }
  }

  /**
   * Takes a place among the tests in flight of the key and of the instance, or refuses at once: a
   * test that waited would hold its request as long as the one it waits for. The key's cap is
   * checked first, so a key over its own cap is told so (429) rather than blamed on the instance.
   */
  private take(apiKeyId: string): () => void {
    const ofKey = this.perKey.get(apiKeyId) ?? 0;
    if (ofKey >= TESTS_IN_FLIGHT_PER_KEY) {
      // Refused before anything is sent: its request-per-minute token goes back.
      throw returningRateToken(new ApiError(
        429,
        'too_many_in_flight',
        `This API key already has ${TESTS_IN_FLIGHT_PER_KEY} webhook test events in flight, its limit; retry when one of them has been answered.`,
        null,
        {},
        { 'Retry-After': String(IN_FLIGHT_RETRY_AFTER_SECONDS) },
      ));
    }
    const releaseTotal = this.total.tryAcquire();
    if (!releaseTotal) {
      throw new ApiError(503, 'server_busy', `Too many webhook test events are being sent; retry in ${IN_FLIGHT_RETRY_AFTER_SECONDS} s.`, null, {}, { 'Retry-After': String(IN_FLIGHT_RETRY_AFTER_SECONDS) });
    }
    this.perKey.set(apiKeyId, ofKey + 1);
    return () => {
      releaseTotal();
      const left = (this.perKey.get(apiKeyId) ?? 1) - 1;
      if (left > 0) this.perKey.set(apiKeyId, left);
      else this.perKey.delete(apiKeyId);
    };
  }
}

/** A finished task as a real event carries it, of a task that does not exist. */
function exampleTask(eventType: TestEventType, publicBaseUrl: string): VideoTask {
  const id = `vid_test_${newId('vid').slice(4)}`;
  const now = new Date().toISOString();
  const task: VideoTask = {
    object: 'video.task',
    id,
    task_id: id,
    generation_id: id,
    status: eventType === 'video.completed' ? 'completed' : 'failed',
    model: 'webhook-test',
    duration: 4,
    duration_seconds: 4,
    aspectRatio: '16:9',
    aspect_ratio: '16:9',
    resolution: '720p',
    generateAudio: false,
    generate_audio: false,
    billing: { kind: 'snapshot', mode: 'per_second', unit: 'second', unitPrice: 0, creditsPerSecond: 0, durationSeconds: 4, quotedCredits: 0, actualCredits: 0 },
    input: { mode: 'text', count: 0 },
    created_at: now,
    completed_at: now,
  };
  if (eventType === 'video.completed') {
    const videoUrl = `${publicBaseUrl}/v1/files/file_webhook_test?expires=0&signature=test`;
    task.video_url = videoUrl;
    task.data = [{ url: videoUrl }];
  } else task.error = { message: 'This is a test event; no task failed.', code: 'upstream_error' };
  return task;
}
