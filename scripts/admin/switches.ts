// `switches list|set`: the global on/off switches of image generation, image edit and video generation.
import { bool, required } from './args.ts';
import type { Commands } from './command.ts';
import { one, table, type Row } from './output.ts';

const SWITCH_COLUMNS = ['name', 'enabled', 'updated_at'];

export const switchCommands: Commands = {
  list: async ({ admin }) => {
    const switches = await admin.switches.list();
    return { json: switches, text: table(switches.data as unknown as Row[], SWITCH_COLUMNS) };
  },

  // `switches set video_generation off`, or the same with --enabled false.
  set: async ({ admin, flags, args, target }) => {
    const name = target();
    const state = flags.enabled ?? args[1];
    const enabled = bool(required(state, 'enabled'), 'enabled');
    return one(await admin.switches.set(name, enabled!));
  },
};
