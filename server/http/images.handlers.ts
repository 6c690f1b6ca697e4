/**
 * POST /v1/images/generations, POST /v1/images/edits (JSON or multipart), GET /v1/images/{task_id},
 * GET /v1/images (the account's tasks).
 * Every image response carries `X-Task-Id`. `Prefer: respond-async` answers 202 with the task and
 * finishes it in the background; `stream: true` or `Accept: text/event-stream` answers with events.
 */
import type { Request, Response } from 'express';
import type { AppContext } from '../context.ts';
import { ApiError } from '../errors.ts';
import type { ImageRequestFields } from '../services/image/image-request.ts';
import { NULL_SINK, type ExecuteResult, type ImageOperation } from '../services/image/image-runner.ts';
import { LeaseLost } from '../services/tasks/task-runner.ts';
import type { ImageEdit } from '../services/image/image.service.ts';
import { jsonStream, pipeBounded, type Base64Source, type WithBase64 } from '../lib/base64-json.ts';
import { logWith } from './access-log.ts';
import { authOf, noStore } from './auth.ts';
import { editInput, stagingOf } from './media-body.ts';
import { uploadedFiles } from './multipart.ts';
import { clientGone } from './request-guards.ts';
import { openImageStream, openJsonAnswer } from './image-answer.ts';
import { sendJson, sendJsonWithImages, type HandlerMap, type ResponseBody, type Schemas } from './types.ts';


function wantsStream(req: Request, body: { stream?: boolean }): boolean {
  return body.stream === true || acceptsEventStream(req.headers.accept);
}

/**
 * `Accept` prefers `text/event-stream`: named (media types in any case) with a `q` above 0 and not
 * below that of `application/json` when both are named (`application/json, text/event-stream;q=0.1`
 * asks for JSON; equal weights stream, as naming the stream alone does). Wildcards choose nothing.
 */
function acceptsEventStream(accept: string | undefined): boolean {
  if (!accept) return false;
  const weights = new Map<string, number>();
  for (const range of accept.split(',')) {
    const [type = '', ...params] = range.split(';').map((p) => p.trim().toLowerCase());
    const q = params.find((p) => p.startsWith('q='));
    const weight = q === undefined ? 1 : Number(q.slice(2));
    if (Number.isFinite(weight)) weights.set(type, Math.max(weights.get(type) ?? 0, weight));
  }
  const stream = weights.get('text/event-stream');
  return stream !== undefined && stream > 0 && stream >= (weights.get('application/json') ?? 0);
}

function wantsAsync(req: Request): boolean {
  return /\brespond-async\b/i.test(String(req.headers.prefer ?? ''));
}

export function imagesHandlers(ctx: AppContext): Pick<HandlerMap, 'createImage' | 'editImage' | 'getImageCapabilities' | 'getImageTask' | 'listImageTasks'> {
  const images = ctx.services.images;
  /**
   * An event stream is written while its task runs, holding the member's slot, the lease and the
   * credits: a client that stops reading it is cut off (STREAM_WRITE_IDLE_MS). A JSON answer is
   * written once the task has settled (its slot free) and is waited for ten times as long: a slow
   * client on a poor network still gets the images it paid for, while one that took nothing for
   * that long no longer holds the answer's buffers (and an edit's share of the large-body budget).
   */
  const idleMs = ctx.config.streamWriteIdleMs;
  const jsonLimits = { idleMs: idleMs * 10 };

  /**
   * A request from its fields to its answer: the task created (validated, priced, held and
   * inserted: `ImageService.create`), then answered 202 (`Prefer: respond-async`), streamed, or run
   * here and answered in JSON (http/image-answer.ts).
   */
  async function run(req: Request, res: Response, operation: ImageOperation, body: ImageRequestFields, edit?: ImageEdit): Promise<void> {
    const stream = wantsStream(req, body);
    const async = wantsAsync(req) && !stream;
    // A synchronous task whose client left while it was being created delivers nothing and is charged nothing.
    const signal = clientGone(req, res);
    const task = await images.create(authOf(req), operation, body, edit, { async, stream });
    res.setHeader('X-Task-Id', task.id);
    // The request's line names its task and, once it has settled, what it bought: a synchronous
    // image's only line at info (a respond-async task's creation and completion are logged apart).
    logWith(res, { taskId: task.id, model: task.model, n: task.n });
    const log = ctx.log.child({ taskId: task.id });
    const charged = (r: ExecuteResult) => {
      const settled = { delivered: r.files.length, capturedMicroCredits: r.captured };
      // A client that left took the request's line with it (written when the connection closed).
      if (!logWith(res, settled)) log.info({ reqId: (req as Request & { id?: string }).id, ...settled }, 'image task settled after its client went away');
    };
    if (async) {
      res.setHeader('Location', `/v1/images/${task.id}`);
      await sendJsonWithImages(res, operation === 'generation' ? 'createImage' : 'editImage', 202, await images.toImageTask(task), jsonLimits);
      return;
    }
    if (stream) {
      const sink = openImageStream(res, { operation, task, limits: { idleMs, signal }, keepAliveMs: ctx.config.streamKeepAliveMs, requestId: (req as Request & { id?: string }).id });
      try {
        const result = await images.runSync(task, sink, signal, log);
        charged(result);
        if (result.error) {
          logWith(res, { errorCode: result.error.code });
          if (sink.withdraw()) throw result.error;
          sink.error(result.error);
        }
      } catch (err) {
        // The stream's status was 200: its line says the error (what was delivered, if anything, is
        // on the task: failed with nothing, or needs_attention with what the stream delivered).
        // Nothing sent yet (no member found, no capacity after the wait): an ordinary error answer,
        // the error middleware's mapping for anything but a lost lease.
        if (!(err instanceof LeaseLost) && sink.withdraw()) throw err;
        const api =
          err instanceof ApiError
            ? err
            : err instanceof LeaseLost
              ? // This request stalled and another worker ended the task with the images it recorded as sent.
                new ApiError(500, 'internal_error', `The stream stopped: task ${task.id} was taken over by another worker. The images sent so far are recorded on it, and an operator will settle it.`)
              : new ApiError(500, 'internal_error', `Internal error. Quote request id '${String((req as Request & { id?: string }).id)}' when reporting it.`);
        logWith(res, { errorCode: api.code });
        if (err instanceof LeaseLost) log.warn({ err: err.message }, 'image stream stopped: its task was taken over');
        else if (!(err instanceof ApiError)) log.error({ err }, 'image stream failed');
        if (sink.withdraw()) throw api;
        sink.error(api);
      }
      sink.end();
      return;
    }
    // The answer is written while the task settles; its last byte waits for the commit.
    const answer = openJsonAnswer(res, { task, limits: { ...jsonLimits, signal } });
    let result: ExecuteResult;
    try {
      result = await images.runSync(task, NULL_SINK, signal, log, { deliveredOnlyIfAllSent: true, whileSettling: answer.whileSettling });
    } catch (err) {
      // The settlement failed after the answer began: the client keeps a truncated answer, never a complete one.
      if (!res.headersSent) throw err;
      log.error({ err }, 'the task did not settle; the answer was cut short');
      res.destroy();
      return;
    }
    charged(result);
    if (signal.aborted) return;
    await answer.end(result);
  }

  return {
    async createImage(req, res) {
      await run(req, res, 'generation', req.body as ImageRequestFields);
    },

    async editImage(req, res) {
      const body = req.body as ImageRequestFields & Partial<Pick<Schemas['ImageEditRequest'], 'images' | 'mask'>>;
      const uploads = uploadedFiles(req);
      const staging = stagingOf(req, ctx.services.files);
      let edit: ImageEdit;
      if (uploads.images.length > 0 || uploads.mask) {
        edit = {
          images: uploads.images.map((f) => ({ data: f.buffer, mimeType: f.mimeType, param: f.fieldname })),
          ...(uploads.mask && { mask: { data: uploads.mask.buffer, mimeType: uploads.mask.mimeType, param: 'mask' } }),
          staging,
        };
      } else {
        // Data URLs were staged while the body was read; file ids and URLs are resolved by the service.
        edit = {
          images: (body.images ?? []).map((item, i) => editInput(item, `images[${i}]`)),
          ...(body.mask !== undefined && { mask: editInput(body.mask, 'mask') }),
          staging,
        };
      }
      await run(req, res, 'edit', body, edit);
    },

    async listImageTasks(req, res) {
      const page: WithBase64<ResponseBody<'listImageTasks', 200>, Base64Source> = await images.list(authOf(req), req.query);
      // Written as a stream: the images of b64_json tasks are read from the store as they are sent.
      // A client that stops reading it is cut off as one of a JSON answer is (`jsonLimits`), and the
      // image being read from the store for it is closed with the response.
      const { body, length } = jsonStream(page);
      noStore(res);
      res.status(200);
      res.setHeader('Content-Type', 'application/json; charset=utf-8');
      res.setHeader('Content-Length', String(length));
      await pipeBounded(body, res, jsonLimits.idleMs, (err) =>
        ctx.log.warn({ reqId: (req as { id?: string }).id, accountId: authOf(req).accountId, err: err.message }, 'image task listing cut off: its client stopped reading'),
      );
    },

    async getImageCapabilities(req, res) {
      noStore(res);
      sendJson(res, 'getImageCapabilities', 200, await images.capabilities(authOf(req)));
    },

    async getImageTask(req, res) {
      noStore(res);
      await sendJsonWithImages(res, 'getImageTask', 200, await images.get(authOf(req), req.params.task_id), jsonLimits);
    },
  };
}
