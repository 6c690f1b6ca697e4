/** Admin API: capability switches. */
import type { AppContext } from '../context.ts';
import { sendJson, type HandlerMap } from './types.ts';

export function adminSwitchesHandlers(ctx: AppContext): Pick<HandlerMap, 'listCapabilitySwitches' | 'setCapabilitySwitch'> {
  const { switches } = ctx.services.admin;
  return {
    async listCapabilitySwitches(_req, res) {
      sendJson(res, 'listCapabilitySwitches', 200, await switches.list());
    },
    async setCapabilitySwitch(req, res) {
      sendJson(res, 'setCapabilitySwitch', 200, await switches.set(req.params.name, req.body.enabled));
    },
  };
}
