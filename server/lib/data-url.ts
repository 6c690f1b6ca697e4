/** Base64 image data URLs (`data:image/png;base64,…`), used by video frames and JSON image edits. */
import { badRequest } from '../errors.ts';

const DATA_URL = /^data:(image\/(?:png|jpeg|jpg|webp|gif));base64,/i;
const BASE64_BODY = /^[A-Za-z0-9+/]*={0,2}$/;

/** Decodes one base64 image data URL; `param` names the field for errors. */
export function decodeImageDataUrl(value: string, param: string): { mimeType: string; data: Buffer } {
  const match = DATA_URL.exec(value.slice(0, 64));
  if (!match) throw badRequest('invalid_data_url', `'${param}' must be a base64 image data URL (data:image/png;base64,...).`, param);
  const body = value.slice(match[0].length);
  // A regex over hundreds of MiB would block the event loop; Buffer.from skips invalid characters,
  // so compare lengths instead: a clean base64 body decodes to exactly 3/4 of its length (minus padding).
  const data = Buffer.from(body, 'base64');
  const padding = body.endsWith('==') ? 2 : body.endsWith('=') ? 1 : 0;
  if (body.length % 4 !== 0 || data.length !== (body.length / 4) * 3 - padding || (body.length < 1024 && !BASE64_BODY.test(body))) {
    throw badRequest('invalid_data_url', `'${param}' is not valid base64.`, param);
  }
  if (data.length === 0) throw badRequest('invalid_data_url', `'${param}' is empty.`, param);
  return { mimeType: match[1]!.toLowerCase().replace('jpg', 'jpeg'), data };
}

