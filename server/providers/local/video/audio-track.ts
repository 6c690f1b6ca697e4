/** The generated audio track: a soft chord picked from the prompt, with a slow swell and fades. */

export const AUDIO_SAMPLE_RATE = 48_000;

/**
 * Stereo float samples at AUDIO_SAMPLE_RATE, computed as the encoder asks for them: a whole track
 * at once was up to 46 MB of samples and, for a 12 s clip, 70 ms of work that held up the event loop.
 */
export interface AudioTrack {
  totalSamples: number;
  /** Writes samples [from, from + left.length) of each channel into left and right. */
  render(from: number, left: Float32Array, right: Float32Array): void;
}

export function makeAudio(seed: number, totalSamples: number): AudioTrack {
  const roots = [220, 246.94, 261.63, 293.66, 329.63, 196];
  const root = roots[seed % roots.length]!;
  const minor = ((seed >>> 4) & 1) === 1;
  const freqs = [root, root * (minor ? 1.1892 : 1.2599), root * 1.4983, root * 2];
  const pans = [0.5, 0.25, 0.75, 0.5];
  const sr = AUDIO_SAMPLE_RATE;
  const fade = Math.min(Math.floor(sr * 0.25), Math.floor(totalSamples / 2));
  return {
    totalSamples,
    render(from, left, right) {
      const end = Math.min(totalSamples, from + left.length);
      for (let i = from; i < end; i++) {
        const t = i / sr;
        let l = 0, r = 0;
        for (let k = 0; k < freqs.length; k++) {
          const env = 0.6 + 0.4 * Math.sin(2 * Math.PI * (0.25 + k * 0.07) * t + k);
          const s = Math.sin(2 * Math.PI * freqs[k]! * t) * env;
          l += s * (1 - pans[k]!);
          r += s * pans[k]!;
        }
        let g = 0.12;
        if (i < fade) g *= i / fade;
        if (totalSamples - i < fade) g *= (totalSamples - i) / fade;
        left[i - from] = l * g;
        right[i - from] = r * g;
      }
    },
  };
}
