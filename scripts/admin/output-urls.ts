/**
 * Download URLs of a task's outputs for `tasks show`, signed as the server signs them: the same
 * configuration (MEDIA_STORE, MEDIA_URLS, PUBLIC_BASE_URL, HOST, PORT, FILE_URL_TTL_SECONDS) and
 * secret key give the URL the admin API would give (a Mediagate signed URL, or a presigned S3 URL).
 * Built on the first task that has outputs, so commands that show none need neither the key nor
 * the media configuration.
 */
import { loadConfig } from '../../server/config.ts';
import type { Kysely } from 'kysely';
import type { DB } from '../../generated/db.d.ts';
import { createTransactor } from '../../server/db/transaction.ts';
import { deriveKey } from '../../server/lib/signing.ts';
import type { Logger } from '../../server/logger.ts';
import { FileRepository } from '../../server/repositories/file.repository.ts';
import { FileService } from '../../server/services/file.service.ts';
import type { OutputUrl } from '../../server/services/admin/task-admin.service.ts';
import { FilesystemMediaStore } from '../../server/storage/media-store.ts';
import { S3MediaStore } from '../../server/storage/s3-media-store.ts';

export function cliOutputUrls(db: Kysely<DB>, log: Logger, secretKey: () => Buffer, env: NodeJS.ProcessEnv): OutputUrl {
  let files: FileService | undefined;
  return (fileId, purpose) => {
    if (!files) {
      const config = loadConfig(env, []);
      const store = config.s3 ? new S3MediaStore(config.s3) : new FilesystemMediaStore(config.mediaDir);
      // The address the server listens on when PUBLIC_BASE_URL is unset (as main.ts names it).
      const host = config.host === '0.0.0.0' || config.host === '::' ? 'localhost' : config.host;
      const base = config.publicBaseUrl ?? `http://${host}:${config.port}`;
      files = new FileService(new FileRepository(db), store, createTransactor(db, log), deriveKey(secretKey(), 'file-url'), base, config.fileUrlTtlSeconds, {
        urls: config.mediaUrls,
        outputRetentionDays: config.outputRetentionDays,
      });
    }
    return files.downloadUrl(fileId, purpose);
  };
}
