/**
 * The MiniMax video models the adapter knows (upstream-apis.md §10.4): MiniMax's spelling of each
 * name, which API generation serves it, and the rules of the model a catalog definition cannot
 * state (it can offer frames, but not require one).
 *
 * Catalog ids are lowercase (the contract's pattern) and MiniMax's names are not
 * (`MiniMax-Hailuo-2.3`), so a known model is found whatever its case and sent in MiniMax's
 * spelling: the shipped definitions' catalog id is the upstream id, and a member needs no model
 * map. A name the adapter does not know goes up as the member's model map gives it, on v1.
 *
 * MiniMax's prompt optimizer rewrites the prompt before rendering; a gateway that sells a prompt
 * sends it off (`prompt_optimizer: false`) unless the catalog model asks for it by the upstream id
 * ending in `-prompt-optimizer` (`minimax-hailuo-2.3-prompt-optimizer`: a catalog model of that id,
 * or a model map to it). No MiniMax name ends so; v2 has no optimizer and ignores the suffix.
 */
export type MiniMaxProtocol = 'v1' | 'v2';

export interface MiniMaxModel {
  /** MiniMax's spelling. */
  name: string;
  protocol: MiniMaxProtocol;
  /** Image-to-video only (a first frame), or subject reference only (one reference image). */
  needs?: 'first-frame' | 'subject';
  /** Resolutions rendered from a first frame only, without a last frame (Hailuo 02's 512p). */
  imageOnlyResolutions?: string[];
}

const KNOWN: MiniMaxModel[] = [
  { name: 'MiniMax-Hailuo-2.3', protocol: 'v1' },
  { name: 'MiniMax-Hailuo-2.3-Fast', protocol: 'v1', needs: 'first-frame' },
  { name: 'MiniMax-Hailuo-02', protocol: 'v1', imageOnlyResolutions: ['512p'] },
  { name: 'T2V-01', protocol: 'v1' },
  { name: 'T2V-01-Director', protocol: 'v1' },
  { name: 'I2V-01', protocol: 'v1', needs: 'first-frame' },
  { name: 'I2V-01-Director', protocol: 'v1', needs: 'first-frame' },
  { name: 'I2V-01-live', protocol: 'v1', needs: 'first-frame' },
  { name: 'S2V-01', protocol: 'v1', needs: 'subject' },
  { name: 'MiniMax-H3', protocol: 'v2' },
  // MiniMax's v2 create page: "switch between MiniMax H3 and MiniMax H3 Max with the `model` field".
  { name: 'MiniMax-H3-Max', protocol: 'v2' },
];
const BY_NAME = new Map(KNOWN.map((m) => [m.name.toLowerCase(), m]));

export const PROMPT_OPTIMIZER_SUFFIX = '-prompt-optimizer';

/**
 * The model an upstream model id names, and whether the prompt optimizer is asked for. `known`: the
 * name is one of MiniMax's models above (another name is sent as a v1 model, whose rules are not known).
 */
export function minimaxModel(upstreamModel: string): MiniMaxModel & { promptOptimizer: boolean; known: boolean } {
  const promptOptimizer = upstreamModel.toLowerCase().endsWith(PROMPT_OPTIMIZER_SUFFIX);
  const name = promptOptimizer ? upstreamModel.slice(0, -PROMPT_OPTIMIZER_SUFFIX.length) : upstreamModel;
  const model = BY_NAME.get(name.toLowerCase());
  return { ...(model ?? { name, protocol: 'v1' }), promptOptimizer, known: model !== undefined };
}
