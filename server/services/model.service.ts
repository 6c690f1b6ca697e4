/** GET /v1/models (product spec §2.1, §4.1). */
import type { components } from '../../generated/api.d.ts';
import type { ModelRepository } from '../repositories/model.repository.ts';
import type { AuthContext } from './auth.service.ts';

type ModelList = components['schemas']['ModelList'];

/** Fixed metadata: models are the operator's offering, not an upstream's. */
export const MODEL_OWNER = 'mediagate';

export class ModelService {
  constructor(private readonly models: ModelRepository) {}

  async listForKey(auth: AuthContext): Promise<ModelList> {
    const rows = await this.models.listVisible(auth.groupId);
    return {
      object: 'list',
      data: rows.map((row) => ({ id: row.id, object: 'model', created: Math.floor(row.createdAt.getTime() / 1000), owned_by: MODEL_OWNER })),
    };
  }
}
