/**
 * Image generation and editing (product spec §2.3, §2.4, §4.3–§4.5, §6.1). Every request creates an
 * image task: the request is validated and priced, n × price is held together with the task insert,
 * the images are rendered and stored one by one and handed to a sink (the JSON response, the event
 * stream, or nothing for background tasks), and then exactly what was delivered is captured and the
 * rest released. An image that was produced but could not be stored leaves the task
 * `needs_attention` with its credits held until an operator settles it.
 */
import type { Kysely } from 'kysely';
import sharp from 'sharp';
import type { components } from '../../../generated/api.d.ts';
import type { DB } from '../../../generated/db.d.ts';
import { ApiError, badRequest, notFound, paymentRequired, unavailable } from '../../errors.ts';
import type { Logger } from '../../logger.ts';
import type { ImageProvider } from '../../providers/image-provider.ts';
import type { FileRow } from '../../repositories/file.repository.ts';
import type { ImageTaskRepository, ImageTaskRow } from '../../repositories/image-task.repository.ts';
import type { LedgerRepository } from '../../repositories/ledger.repository.ts';
import type { ModelRepository } from '../../repositories/model.repository.ts';
import type { RoutingRepository } from '../../repositories/routing.repository.ts';
import type { AuthContext } from '../auth.service.ts';
import type { FileService } from '../file.service.ts';
import { newId } from '../ids.ts';
import { pickMember } from '../member-router.ts';
import { toCredits } from '../money.ts';
import { normalizeImageRequest, type ImageParams, type ImageRequestFields } from './image-request.ts';
import { CUSTOM_SIZE_LIMITS, customSizeTier, ratioOf } from './image-size.ts';

type Schemas = components['schemas'];

export type ImageOperation = 'generation' | 'edit';

/** An input image of an edit: bytes to store, or a file this account already has. */
export type EditInput = { data: Buffer; mimeType: string; param: string } | { fileId: string; param: string };

export interface PreparedImageRequest {
  operation: ImageOperation;
  model: string;
  prompt: string;
  memberId: string;
  n: number;
  unitPrice: number;
  params: ImageParams;
  inputs: { fileId?: string; data?: Buffer; mimeType: string; width: number; height: number }[];
  mask: { fileId?: string; data?: Buffer; mimeType: string } | undefined;
}

/** Where rendered images go. `image` resolves once the client has the image (stream) or at once. */
export interface ImageSink {
  partial(imageIndex: number, partialIndex: number, image: Buffer): Promise<void>;
  image(imageIndex: number, image: Buffer, file: FileRow): Promise<void>;
}

export const NULL_SINK: ImageSink = { partial: async () => undefined, image: async () => undefined };

export interface ExecuteResult {
  status: 'completed' | 'failed' | 'needs_attention';
  files: FileRow[];
  images: Buffer[];
  /** The upstream's revised prompt, when it gives one. */
  revisedPrompt?: string;
  /** Set when the provider failed after some images were delivered (streams report it as `event: error`). */
  error?: ApiError;
}

export interface ImageServiceDeps {
  tasks: ImageTaskRepository;
  models: ModelRepository;
  routing: RoutingRepository;
  ledger: LedgerRepository;
  files: FileService;
  providers: Map<string, ImageProvider>;
  db: Kysely<DB>;
  log: Logger;
  options: { sizeParam: 'accept' | 'reject'; leaseMs: number; maxEditImages: number };
}

const MIME: Record<string, string> = { png: 'image/png', jpeg: 'image/jpeg', webp: 'image/webp' };

/** Scales a size down (keeping its ratio, even edges) into the custom-size limits: edges ≤ 3840, pixels ≤ 8,294,400. */
export function fitWithinLimits(width: number, height: number): { width: number; height: number } {
  const scale = Math.min(1, CUSTOM_SIZE_LIMITS.maxEdge / Math.max(width, height), Math.sqrt(CUSTOM_SIZE_LIMITS.maxPixels / (width * height)));
  if (scale === 1) return { width, height };
  const even = (n: number) => Math.max(2, Math.floor((n * scale) / 2) * 2);
  return { width: even(width), height: even(height) };
}

export class ImageService {
  constructor(private readonly deps: ImageServiceDeps) {}

  /** Validates and prices a request; nothing is written. */
  async prepare(auth: AuthContext, operation: ImageOperation, fields: ImageRequestFields, edit?: { images: EditInput[]; mask?: EditInput }): Promise<PreparedImageRequest> {
    const switchName = operation === 'generation' ? 'image_generation' : 'image_edit';
    const model = await this.deps.models.findImageModel(auth.groupId, fields.model, switchName);
    if (!model) throw new ApiError(404, 'model_not_found', `Image model '${fields.model}' does not exist or is not available to this key.`, 'model');
    if (!model.switchedOn) throw unavailable('capability_disabled', `Image ${operation === 'generation' ? 'generation' : 'editing'} is switched off by the operator.`);
    if (!model.reachable) throw unavailable('no_reachable_member', `No enabled backend member serves model '${fields.model}' for this key.`);

    const inputs: PreparedImageRequest['inputs'] = [];
    let mask: PreparedImageRequest['mask'];
    if (operation === 'edit') {
      const images = edit?.images ?? [];
      if (images.length === 0) throw badRequest('invalid_request', 'An edit needs at least one input image.', 'image');
      if (images.length > this.deps.options.maxEditImages) throw badRequest('too_many_images', `At most ${this.deps.options.maxEditImages} input images are accepted; got ${images.length}.`, 'image');
      for (const input of images) inputs.push(await this.loadInput(auth, input));
      if (edit?.mask) {
        const m = await this.loadInput(auth, edit.mask);
        const first = inputs[0]!;
        if (m.width !== first.width || m.height !== first.height) {
          throw badRequest('mask_size_mismatch', `The mask is ${m.width}x${m.height} but the first image is ${first.width}x${first.height}; they must match.`, 'mask');
        }
        mask = m;
      }
    }

    const first = inputs[0];
    const keepInputSize = operation === 'edit' && first && (fields.size === undefined || fields.size === 'auto') && fields.aspectRatio === undefined && fields.aspect_ratio === undefined && fields.resolution === undefined;
    const priced = normalizeImageRequest(keepInputSize ? { ...fields, size: undefined } : fields, model.capabilities, model.prices, { sizeParam: this.deps.options.sizeParam });
    if (keepInputSize && first) {
      // An edit with no size keeps the input's size (scaled down into the custom-size limits when
      // larger), billed at the tier of its pixel count, or the largest tier the model offers.
      const { width, height } = fitWithinLimits(first.width, first.height);
      const tier = customSizeTier(width, height);
      const resolution = model.capabilities.resolutions.includes(tier) ? tier : model.capabilities.resolutions.at(-1)!;
      const repriced = normalizeImageRequest({ ...fields, size: undefined, resolution }, model.capabilities, model.prices, { sizeParam: this.deps.options.sizeParam });
      priced.unitPrice = repriced.unitPrice;
      priced.params = { ...priced.params, width, height, resolution, aspectRatio: ratioOf(width, height) };
    }

    const member = pickMember(await this.deps.routing.candidates(auth.groupId, model.id), (p) => this.deps.providers.has(p));
    if (!member) throw unavailable('no_reachable_member', `No enabled backend member can run model '${model.id}' here.`);
    return { operation, model: model.id, prompt: fields.prompt, memberId: member.id, n: priced.n, unitPrice: priced.unitPrice, params: priced.params, inputs, mask };
  }

  private async loadInput(auth: AuthContext, input: EditInput) {
    let data: Buffer;
    let fileId: string | undefined;
    if ('fileId' in input) {
      const file = await this.deps.files.find(input.fileId);
      if (!file || file.accountId !== auth.accountId) throw badRequest('image_not_found', `'${input.param}' names no file of this account.`, input.param);
      data = await this.deps.files.readAll(file.id);
      fileId = file.id;
    } else data = input.data;
    const meta = await sharp(data)
      .metadata()
      .catch(() => undefined);
    if (!meta?.width || !meta.height || !meta.format) throw badRequest('invalid_image', `'${input.param}' is not a decodable image.`, input.param);
    if (input.param === 'mask' && !meta.hasAlpha) throw badRequest('invalid_image', 'The mask needs an alpha channel: its transparent area marks the region to edit.', 'mask');
    const mimeType = meta.format === 'jpeg' ? 'image/jpeg' : `image/${meta.format}`;
    return fileId ? { fileId, mimeType, width: meta.width, height: meta.height } : { data, mimeType, width: meta.width, height: meta.height };
  }

  /**
   * Stores the inputs, holds n × price and inserts the task in one statement. A synchronous task
   * starts with this request holding its lease; an async one waits for the task engine.
   */
  async start(auth: AuthContext, req: PreparedImageRequest, mode: { async: boolean; workerId: string }): Promise<ImageTaskRow> {
    const taskId = newId('img');
    const saved: FileRow[] = [];
    const store = async (input: { fileId?: string; data?: Buffer; mimeType: string; width?: number; height?: number }) => {
      if (input.fileId) return input.fileId;
      const file = await this.deps.files.save(
        { accountId: auth.accountId, purpose: 'input', contentType: input.mimeType, taskId, ...(input.width && { width: input.width }), ...(input.height && { height: input.height }) },
        input.data!,
      );
      saved.push(file);
      return file.id;
    };
    const inputFileIds: string[] = [];
    for (const input of req.inputs) inputFileIds.push(await store(input));
    const maskFileId = req.mask ? await store(req.mask) : null;

    const quoted = req.unitPrice * req.n;
    const row = {
      id: taskId,
      account_id: auth.accountId,
      api_key_id: auth.apiKeyId,
      group_id: auth.groupId,
      operation: req.operation,
      model: req.model,
      prompt: req.prompt,
      params: JSON.stringify(req.params),
      input_file_ids: inputFileIds,
      mask_file_id: maskFileId,
      n: req.n,
      unit_price: req.unitPrice,
      quoted_credits: quoted,
      run_async: mode.async,
      member_id: req.memberId,
      attempt: mode.async ? 0 : 1,
      lease_owner: mode.async ? null : mode.workerId,
      lease_expires_at: mode.async ? null : new Date(Date.now() + this.deps.options.leaseMs),
    };
    const outcome = await this.deps.ledger
      .holdAndInsertTask({ holdId: newId('hold'), accountId: auth.accountId, apiKeyId: auth.apiKeyId, taskId, amount: quoted }, { table: 'image_tasks', row })
      .catch(async (err: unknown) => {
        for (const file of saved) await this.deps.files.discard(file);
        throw err;
      });
    // Inputs stored for a task that was not created are removed.
    if (outcome !== 'ok') for (const file of saved) await this.deps.files.discard(file);
    if (outcome === 'key_quota_exceeded') throw paymentRequired('key_quota_exceeded', `This API key's credit limit cannot cover ${req.n} image(s) (${toCredits(quoted)} credits).`);
    if (outcome === 'insufficient_balance') throw paymentRequired('insufficient_balance', `The account balance cannot cover ${req.n} image(s) (${toCredits(quoted)} credits).`);
    this.deps.log.info({ taskId, model: req.model, n: req.n, quotedMicroCredits: quoted, async: mode.async }, 'image task created');
    return (await this.deps.tasks.find(taskId))!;
  }

  /**
   * Renders the task's images in order, storing each and handing it to the sink, then settles:
   * completed with what was delivered (captured), the rest released. Stops early when `signal`
   * aborts (the client went away). Fenced by the task's attempt.
   */
  async execute(task: ImageTaskRow, sink: ImageSink, signal: AbortSignal, log: Logger, opts: { deliveredOnlyIfAllSent?: boolean } = {}): Promise<ExecuteResult> {
    const fence = { id: task.id, attempt: task.attempt };
    const params = task.params as unknown as ImageParams;
    const member = task.memberId ? await this.deps.routing.find(task.memberId) : undefined;
    const provider = member && this.deps.providers.get(member.provider);
    if (!provider) {
      await this.fail(fence, 'no_reachable_member', `No backend member can run model '${task.model}'; the credits were released.`);
      return { status: 'failed', files: [], images: [] };
    }
    const inputs = await Promise.all(task.inputFileIds.map((id) => this.deps.files.readAll(id)));
    const mask = task.maskFileId ? await this.deps.files.readAll(task.maskFileId) : undefined;
    const job = { operation: task.operation as ImageOperation, model: task.model, prompt: task.prompt, params, inputs, ...(mask && { mask }) };

    const files: FileRow[] = [];
    const images: Buffer[] = [];
    let revisedPrompt: string | null = null;
    let failure: ApiError | undefined;
    for (let i = 0; i < task.n && !signal.aborted; i++) {
      let rendered;
      try {
        rendered = await provider.render(job, i, signal, (k, buf) => sink.partial(i, k, buf));
      } catch (err) {
        if (signal.aborted) break;
        log.warn({ err, imageIndex: i }, 'image render failed');
        if (files.length === 0) {
          await this.fail(fence, 'upstream_error', 'The image provider failed to generate the image; the credits were released.');
          throw new ApiError(502, 'upstream_error', `The image provider failed; task ${task.id} failed and its credits were released.`);
        }
        failure = new ApiError(502, 'upstream_error', `The image provider failed after ${files.length} of ${task.n} images; only the delivered images are charged.`);
        break;
      }
      revisedPrompt ??= rendered.revisedPrompt ?? null;
      let file: FileRow;
      try {
        file = await this.deps.files.save(
          { accountId: task.accountId, purpose: 'image_output', contentType: MIME[params.outputFormat]!, taskId: task.id, width: params.width, height: params.height },
          rendered.image,
        );
      } catch (err) {
        log.error({ err, imageIndex: i }, 'image produced but not stored: task needs attention');
        await this.deps.tasks.markNeedsAttention(fence, 'The image was generated but could not be stored; an operator will settle this task.', {
          fileIds: files.map((f) => f.id),
          delivered: files.length,
        });
        throw new ApiError(502, 'upstream_error', `The image was generated but could not be stored; task ${task.id} needs attention and its credits stay held until an operator settles it.`);
      }
      try {
        await sink.image(i, rendered.image, file);
      } catch {
        // The client went away while this image was being delivered: it is not counted.
        await this.deps.files.discard(file);
        break;
      }
      files.push(file);
      images.push(rendered.image);
    }

    // A JSON response delivers nothing until it is written: a client that left before it gets nothing.
    if (opts.deliveredOnlyIfAllSent && signal.aborted) {
      for (const file of files) await this.deps.files.discard(file);
      files.length = 0;
    }
    if (files.length === 0) {
      await this.fail(fence, 'client_disconnected', 'The client disconnected before any image was delivered; the credits were released.');
      return { status: 'failed', files, images };
    }
    const captured = files.length * task.unitPrice;
    const done = await this.deps.db.transaction().execute(async (trx) => {
      if (!(await this.deps.tasks.markCompleted(fence, { fileIds: files.map((f) => f.id), delivered: files.length, actualCredits: captured, revisedPrompt }, trx))) return false;
      const hold = await this.deps.ledger.findHoldByTask(task.id, trx);
      if (hold && !(await this.deps.ledger.settle(hold.id, captured, trx))) throw new Error(`hold of task ${task.id} was already settled`);
      return true;
    });
    if (!done) throw new ApiError(500, 'internal_error', `Task ${task.id} was taken over by another worker.`);
    log.info({ delivered: files.length, n: task.n, capturedMicroCredits: captured }, 'image task completed');
    return { status: 'completed', files, images, ...(revisedPrompt && { revisedPrompt }), ...(failure && { error: failure }) };
  }

  /** Fails the task (fenced by its attempt) and releases its hold. */
  async fail(fence: { id: string; attempt: number }, code: string, message: string): Promise<void> {
    await this.deps.db.transaction().execute(async (trx) => {
      if (!(await this.deps.tasks.markFailed(fence, code, message, trx))) return;
      const hold = await this.deps.ledger.findHoldByTask(fence.id, trx);
      if (hold) await this.deps.ledger.settle(hold.id, 0, trx);
    });
  }

  /** GET /v1/images/{task_id}: the owner's task only. */
  async get(auth: AuthContext, id: string): Promise<Schemas['ImageTask']> {
    const row = await this.deps.tasks.findForAccount(id, auth.accountId);
    if (!row) throw notFound('task_not_found', `No image task '${id}' exists for this account.`);
    return this.toImageTask(row);
  }

  async toImageTask(row: ImageTaskRow): Promise<Schemas['ImageTask']> {
    const task: Schemas['ImageTask'] = {
      id: row.id,
      object: 'image.task',
      status: row.status as Schemas['ImageTask']['status'],
      model: row.model,
      created: Math.floor(row.createdAt.getTime() / 1000),
      created_at: row.createdAt.toISOString(),
    };
    if (row.completedAt && (row.status === 'completed' || row.status === 'failed')) {
      task.completed = Math.floor(row.completedAt.getTime() / 1000);
      task.completed_at = row.completedAt.toISOString();
    }
    if (row.status === 'completed') task.data = await this.resultData(row);
    if (row.status === 'failed') task.error = { message: row.errorMessage ?? 'The task failed.', code: row.errorCode };
    return task;
  }

  /** `data[]` of a task's stored results in its response format. */
  async resultData(row: ImageTaskRow): Promise<Schemas['ImageData'][]> {
    const params = row.params as unknown as ImageParams;
    return Promise.all(
      row.resultFileIds.map(async (id) => {
        const item: Schemas['ImageData'] = params.responseFormat === 'url' ? { url: this.deps.files.signedUrl(id) } : { b64_json: (await this.deps.files.readAll(id)).toString('base64') };
        if (row.revisedPrompt) item.revised_prompt = row.revisedPrompt;
        return item;
      }),
    );
  }

  /** The synchronous JSON response (product spec §2.3) from what execute() delivered. */
  toImageResult(task: ImageTaskRow, result: ExecuteResult): Schemas['ImageResult'] {
    const params = task.params as unknown as ImageParams;
    return {
      created: Math.floor(task.createdAt.getTime() / 1000),
      data: result.files.map((file, i) => ({
        ...(params.responseFormat === 'url' ? { url: this.deps.files.signedUrl(file.id) } : { b64_json: result.images[i]!.toString('base64') }),
        ...(result.revisedPrompt && { revised_prompt: result.revisedPrompt }),
      })),
      output_format: params.outputFormat,
      size: `${params.width}x${params.height}`,
      quality: params.resolvedQuality,
      background: params.transparent ? 'transparent' : 'opaque',
    };
  }

  /**
   * Operator settlement of a needs_attention task. `completed`: the operator confirms the outcome
   * (e.g. delivered the results out of band): the whole hold is captured. `refunded`: only the
   * images that were stored and delivered before the failure are charged; the rest is released.
   */
  async settle(id: string, outcome: 'completed' | 'refunded', reason: string): Promise<ImageTaskRow> {
    const row = await this.deps.tasks.find(id);
    if (!row) throw notFound('task_not_found', `No task '${id}'.`);
    const settled = await this.deps.db.transaction().execute(async (trx) => {
      const captured = outcome === 'completed' ? row.quotedCredits : row.delivered * row.unitPrice;
      if (!(await this.deps.tasks.settle(id, outcome, reason, captured, trx))) return false;
      const hold = await this.deps.ledger.findHoldByTask(id, trx);
      if (hold && !(await this.deps.ledger.settle(hold.id, captured, trx))) throw new Error(`hold of task ${id} was already settled`);
      return true;
    });
    if (!settled) throw new ApiError(409, 'task_not_settleable', `Task '${id}' is ${row.status}; only a needs_attention image task can be settled.`);
    this.deps.log.info({ taskId: id, outcome, reason }, 'image task settled by operator');
    return (await this.deps.tasks.find(id))!;
  }
}
