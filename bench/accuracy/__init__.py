"""What the worker gets right: WER beside plain faster-whisper, languages, speakers."""
