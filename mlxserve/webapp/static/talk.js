"use strict";
// Talk: a live voice session on the chat page over the Realtime API (/v1/realtime). The
// microphone goes in as 24 kHz pcm16, the server hears when the user stops (its voice
// detector), and the answer comes back as text and speech while it is written. Speaking
// over an answer stops it; the conversation so far goes with the session.

const TALK_RATE = 24000;

class Talk {
  constructor(model, history, instructions, onEnd) {
    this.history = history;
    this.onEnd = onEnd;
    this.views = {}; // response id -> its ReplyView and text
    this.playing = []; // audio sources scheduled, to stop on barge-in
    this.playAt = 0;
    this.heardMs = 0; // of the answer playing now
    const key = localStorage.getItem(KEY_STORE);
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}/v1/realtime?model=${encodeURIComponent(model)}`;
    this.socket = new WebSocket(url, ["realtime", ...(key ? [`openai-insecure-api-key.${key}`] : [])]);
    this.socket.onopen = () => this.opened(history, instructions);
    this.socket.onmessage = (message) => this.event(JSON.parse(message.data));
    this.socket.onclose = () => this.stop();
    this.socket.onerror = () => showBanner("The voice session could not open.");
  }

  send(event) {
    if (this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(event));
  }

  async opened(history, instructions) {
    const temperature = numberSetting("temperature"); // the chat page's settings hold
    const maxTokens = numberSetting("max-tokens");
    this.send({ type: "session.update", session: {
      type: "realtime",
      ...(instructions ? { instructions } : {}),
      ...(temperature !== undefined ? { temperature } : {}),
      ...(maxTokens !== undefined ? { max_output_tokens: Math.min(maxTokens, 4096) } : {}),
      audio: { input: { transcription: { model: null } } },
    } });
    for (const message of history) { // the typed conversation so far
      const text = typeof message.content === "string" ? message.content : "";
      if (!text) continue;
      const part = message.role === "assistant" ? { type: "output_text", text } : { type: "input_text", text };
      this.send({ type: "conversation.item.create", item: { type: "message", role: message.role, content: [part] } });
    }
    try {
      this.audio = new AudioContext({ sampleRate: TALK_RATE });
      await this.audio.audioWorklet.addModule("/app/microphone.js");
      this.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
      const source = this.audio.createMediaStreamSource(this.stream);
      const microphone = new AudioWorkletNode(this.audio, "microphone");
      microphone.port.onmessage = (message) => this.send({ type: "input_audio_buffer.append", audio: pcm16Base64(message.data) });
      source.connect(microphone);
      $("talk").textContent = "Stop talking";
      $("talk").classList.add("live");
    } catch (error) {
      showBanner(`No microphone: ${error.message}`);
      this.stop();
    }
  }

  event(event) {
    switch (event.type) {
      case "input_audio_buffer.speech_started":
        this.silence(); // barge-in: the server cancels the answer, the speakers stop now
        break;
      case "conversation.item.input_audio_transcription.completed":
        userMessage(event.transcript, []);
        this.history.push({ role: "user", content: event.transcript });
        break;
      case "response.created":
        this.views[event.response.id] = { view: new ReplyView(), text: "", started: performance.now(), first: null };
        this.heardMs = 0;
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta": {
        const reply = this.views[event.response_id];
        reply.text += event.delta;
        reply.view.content(reply.text);
        break;
      }
      case "response.output_audio.delta": {
        const reply = this.views[event.response_id];
        if (reply.first === null) reply.first = performance.now();
        this.play(event.delta);
        break;
      }
      case "response.done": {
        const reply = this.views[event.response.id];
        if (!reply) break;
        const item = (event.response.output || []).find((o) => o.type === "message");
        const spoken = item && item.content[0] ? item.content[0].transcript || item.content[0].text || "" : reply.text;
        reply.view.content(spoken);
        const parts = [];
        if (reply.first !== null) parts.push(`first audio ${((reply.first - reply.started) / 1000).toFixed(2)} s`);
        parts.push(`spoken ${(this.heardMs / 1000).toFixed(1)} s`);
        if (event.response.status !== "completed") parts.push(event.response.status);
        reply.view.figures(parts.join(" · "));
        this.history.push({ role: "assistant", content: spoken });
        break;
      }
      case "error":
        showBanner(event.error.message);
        break;
      default:
        break;
    }
  }

  play(base64) {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const samples = new Int16Array(bytes.buffer);
    const buffer = this.audio.createBuffer(1, samples.length, TALK_RATE);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
    const source = this.audio.createBufferSource();
    source.buffer = buffer;
    source.connect(this.audio.destination);
    this.playAt = Math.max(this.playAt, this.audio.currentTime);
    source.start(this.playAt);
    this.playAt += buffer.duration;
    this.heardMs += Math.round(buffer.duration * 1000);
    this.playing.push(source);
    source.onended = () => { this.playing = this.playing.filter((s) => s !== source); };
  }

  silence() {
    for (const source of this.playing) source.stop();
    this.playing = [];
    if (this.audio) this.playAt = this.audio.currentTime;
  }

  stop() {
    if (this.stopped) return;
    this.stopped = true;
    this.silence();
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    if (this.audio) this.audio.close();
    if (this.socket.readyState <= WebSocket.OPEN) this.socket.close();
    $("talk").textContent = "Talk";
    $("talk").classList.remove("live");
    this.onEnd();
  }
}

function pcm16Base64(floats) {
  const samples = new Int16Array(floats.length);
  for (let i = 0; i < floats.length; i++) samples[i] = Math.max(-1, Math.min(1, floats[i])) * 32767;
  let binary = "";
  const bytes = new Uint8Array(samples.buffer);
  for (let i = 0; i < bytes.length; i++) binary += String.fromCharCode(bytes[i]);
  return btoa(binary);
}
