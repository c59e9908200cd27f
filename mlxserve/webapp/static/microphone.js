"use strict";
// The microphone's samples, as they come, to the page (an AudioWorklet: the audio thread).
class Microphone extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) this.port.postMessage(channel.slice(0));
    return true;
  }
}
registerProcessor("microphone", Microphone);
