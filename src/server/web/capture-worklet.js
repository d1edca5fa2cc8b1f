// Runs on the audio rendering thread: gathers the microphone's 128-sample render quanta into
// blocks of `blockFrames` samples (one Opus packet) and posts each block to the page.
class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.blockFrames = options.processorOptions.blockFrames;
    this.block = new Float32Array(this.blockFrames);
    this.fill = 0;
  }

  process(inputs) {
    const input = inputs[0];
    if (input && input.length > 0) {
      const ch = input[0];
      let i = 0;
      while (i < ch.length) {
        const n = Math.min(ch.length - i, this.blockFrames - this.fill);
        this.block.set(ch.subarray(i, i + n), this.fill);
        this.fill += n;
        i += n;
        if (this.fill === this.blockFrames) {
          this.port.postMessage(this.block, [this.block.buffer]);
          this.block = new Float32Array(this.blockFrames);
          this.fill = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor('ppx-capture', CaptureProcessor);
