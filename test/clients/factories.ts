import type { ErrorCode, VideoBillingRow, VideoTask, VideoTaskCreated } from '../../clients/typescript/index.ts';
import type { components } from '../../generated/api.d.ts';

type Schemas = components['schemas'];

export function videoTaskCreated(overrides: Partial<VideoTaskCreated> = {}): VideoTaskCreated {
  return {
    object: 'video.task',
    id: 'vid_1',
    task_id: 'vid_1',
    generation_id: 'vid_1',
    status: 'queued',
    model: 'local-video-1',
    duration: 8,
    duration_seconds: 8,
    aspectRatio: '16:9',
    aspect_ratio: '16:9',
    resolution: '720p',
    generateAudio: false,
    generate_audio: false,
    billing: {
      kind: 'snapshot',
      mode: 'per_second',
      unit: 'second',
      unitPrice: 0.12,
      creditsPerSecond: 0.12,
      durationSeconds: 8,
      quotedCredits: 0.96,
      actualCredits: 0,
    },
    ...overrides,
  };
}

export function videoTask(overrides: Partial<VideoTask> = {}): VideoTask {
  return {
    ...videoTaskCreated(),
    status: 'in_progress',
    input: { mode: 'text', count: 0 },
    created_at: '2026-01-01T00:00:00Z',
    ...overrides,
  };
}

export function billingRow(overrides: Partial<VideoBillingRow> = {}): VideoBillingRow {
  return {
    kind: 'current_quote',
    resolution: '720p',
    mode: 'per_second',
    unit: 'second',
    unitPrice: 0.15,
    creditsPerSecond: 0.15,
    quoteToken: 'q1.fresh.token',
    ...overrides,
  };
}

export function errorBody(code: ErrorCode, overrides: Partial<Schemas['ErrorResponse']> = {}): Schemas['ErrorResponse'] {
  return {
    error: { message: `failed: ${code}`, type: 'invalid_request_error', code, param: null },
    ...overrides,
  };
}

export function quoteConflictBody(code: 'quote_stale' | 'quote_expired', quote: VideoBillingRow): Schemas['ErrorResponse'] {
  return {
    error: { message: 'The quoted price changed.', type: 'conflict_error', code, param: 'quote_token' },
    currentQuote: quote,
  };
}

export function partialImageEvent(index: number): Schemas['ImageGenerationPartialImageEvent'] {
  return {
    type: 'image_generation.partial_image',
    b64_json: `cGFydGlhbA${index}==`,
    partial_image_index: index,
    image_index: 0,
    created_at: 1767225601,
    size: '1248x1248',
    quality: 'auto',
    background: 'auto',
    output_format: 'png',
  };
}

export function completedImageEvent(): Schemas['ImageGenerationCompletedEvent'] {
  return {
    type: 'image_generation.completed',
    b64_json: 'ZmluYWw=',
    image_index: 0,
    created_at: 1767225603,
    size: '1248x1248',
    quality: 'high',
    background: 'opaque',
    output_format: 'png',
    usage: { input_tokens: 10, output_tokens: 20, total_tokens: 30, input_tokens_details: { text_tokens: 10, image_tokens: 0 } },
  };
}
