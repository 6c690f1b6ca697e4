/**
 * `POST /v1/webhooks/test`: a signed test event sent at once to a URL the developer gives, so a
 * receiver can be checked before a real task ends. The event is signed with the account's secrets
 * and sent as real deliveries are (`sendSignedWebhook`), through the same target rules (public
 * https; with ALLOW_PRIVATE_TARGETS also private hosts and http:// to this machine). Its body is a
 * `VideoTask` as a real event carries, of a task that does not exist (`vid_test_…`, model
 * `webhook-test`): nothing is created, charged or stored, and the answer says what the receiver did.
 */
import type { components } from '../../../generated/api.d.ts';
import { ApiError } from '../../errors.ts';
import { newId } from '../../lib/ids.ts';
import { OutboundUrlError, parseOutboundUrl } from '../../lib/outbound-url.ts';
import type { Logger } from '../../logger.ts';
import type { WebhookSecrets } from './webhook-secrets.ts';
import { sendSignedWebhook, type SendOptions, type SendOutcome } from './webhook-send.ts';

type VideoTask = components['schemas']['VideoTask'];
export type TestEventType = 'video.completed' | 'video.failed';

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

  async send(accountId: string, url: string, eventType: TestEventType): Promise<WebhookTestResult> {
    try {
      parseOutboundUrl(url, { allowPrivate: this.deps.send.allowPrivate });
    } catch (err) {
      if (!(err instanceof OutboundUrlError)) throw err;
      const which = this.deps.send.allowPrivate ? 'an https URL (or http:// to this machine)' : 'a public https URL';
      throw new ApiError(400, 'invalid_callback_url', `url must be ${which}: ${err.message}.`, 'url');
    }
    const webhookId = newId('msg');
    const task = exampleTask(eventType, this.deps.publicBaseUrl);
    const outcome = await sendSignedWebhook(url, webhookId, JSON.stringify(task), await this.deps.secrets.signing(accountId), this.deps.send);
    this.deps.log.info({ accountId, webhookId, statusCode: outcome.statusCode, errorClass: outcome.errorClass, latencyMs: outcome.latencyMs }, 'webhook test event sent');
    return { ...outcome, webhookId, eventType, taskId: task.id };
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
