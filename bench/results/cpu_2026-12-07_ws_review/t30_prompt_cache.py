# Unique text prompts per session (a client defeating the prompt cache): does the cache stay within its cap, RSS flat?
import time, os, random
from wslib import *
pid=server_pid()
for i in range(40):
    w=WS("/api/chat?voice_prompt=&text_prompt=unique%20prompt%20"+str(random.random()))
    while True:
        m=w.recv_msg(10)
        if m[0]=="close" or m[1][:1] in (b"\x00",b"\x05"): break
    w.close(); w.shut(); wait_idle(10)
    if i%10==9:
        pc=health()["prompt_cache"]; print(i+1, "sessions: cache", pc, "rss", rss_kb(pid))
