// AudioWorklet: microphone samples (at the AudioContext's rate) -> mono 16-bit PCM frames of ~100 ms at
// processorOptions.rate (16 kHz unless told: 24 kHz for the OpenAI Realtime protocol), posted to the page as
// ArrayBuffers. Linear interpolation keeps a fractional read position across blocks.
class PcmWorklet extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const rate = (options && options.processorOptions && options.processorOptions.rate) || 16000;
    this.step = sampleRate / rate;    // input samples per output sample
    this.pos = 0;                     // read position into `this.tail` + the new block
    this.tail = new Float32Array(0);  // the last input sample(s) of the previous block
    this.out = new Int16Array(rate / 10);
    this.fill = 0;
  }
  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const n = channels[0].length;
    const x = new Float32Array(this.tail.length + n);
    x.set(this.tail);
    for (let i = 0; i < n; i++) {  // mix down
      let v = 0;
      for (const c of channels) v += c[i];
      x[this.tail.length + i] = v / channels.length;
    }
    while (this.pos + 1 < x.length) {
      const i = Math.floor(this.pos), f = this.pos - i;
      const v = Math.max(-1, Math.min(1, x[i] * (1 - f) + x[i + 1] * f));
      this.out[this.fill++] = v < 0 ? v * 32768 : v * 32767;
      if (this.fill === this.out.length) {
        this.port.postMessage(this.out.buffer.slice(0));
        this.fill = 0;
      }
      this.pos += this.step;
    }
    const keep = Math.floor(this.pos);
    this.tail = x.slice(keep);
    this.pos -= keep;
    return true;
  }
}
registerProcessor("pcm-worklet", PcmWorklet);
