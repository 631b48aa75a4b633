"""A launched worker: listens on its TF_CONFIG port, prints it, then connects to the other worker's."""
import json, os, socket, sys, time
cfg = json.loads(os.environ["TF_CONFIG"]); me = int(cfg["task"]["index"]); addrs = cfg["cluster"]["worker"]
port = int(addrs[me].split(":")[1])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port)); s.listen()
print("PORT", port, flush=True)
time.sleep(1.5)
other = addrs[1 - me]
c = socket.create_connection((other.split(":")[0], int(other.split(":")[1])), timeout=2)
print("reached", other, flush=True)
time.sleep(2)
