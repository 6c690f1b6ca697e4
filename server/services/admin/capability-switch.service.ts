/** The three system capability switches (image_generation, image_edit, video_generation). */
import type { components } from '../../../generated/api.d.ts';
import { badRequest } from '../../errors.ts';
import type { CapabilitySwitchRepository } from '../../repositories/capability-switch.repository.ts';
import { CAPABILITY_NAMES, toAdminCapabilitySwitch, type AdminCapabilityName, type AdminCapabilitySwitch } from './admin-mappers.ts';

export class CapabilitySwitchService {
  constructor(private readonly switches: CapabilitySwitchRepository) {}

  /** Always all three, in the contract's order. */
  async list(): Promise<components['schemas']['AdminCapabilitySwitchList']> {
    const rows = await this.switches.list();
    const rank = (name: string) => CAPABILITY_NAMES.indexOf(name as AdminCapabilityName);
    return { data: rows.sort((a, b) => rank(a.name) - rank(b.name)).map(toAdminCapabilitySwitch) };
  }

  /** Idempotent; an unknown name is `400 invalid_request` (the CLI passes names unvalidated). */
  async set(name: string, enabled: boolean): Promise<AdminCapabilitySwitch> {
    const row = CAPABILITY_NAMES.includes(name as AdminCapabilityName) ? await this.switches.set(name, enabled) : undefined;
    if (!row) throw badRequest('invalid_request', `Unknown capability switch '${name}' (one of ${CAPABILITY_NAMES.join(', ')}).`, 'name');
    return toAdminCapabilitySwitch(row);
  }
}
