import errno, os, socket, sys, tempfile
secret, port, pid, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = []
def tr(name, fn):
    try:
        fn()
        out.append(name + "=ok")
    except OSError as e:
        out.append(name + "=" + (errno.errorcode.get(e.errno, "errno%d" % (e.errno or 0))))
def read(p):
    with open(p, "rb") as f:
        f.read()
def write(p):
    with open(p, "wb") as f:
        f.write(b"x")
def tmp():
    fd, p = tempfile.mkstemp()
    os.close(fd)
    os.unlink(p)
def tcp():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.close()
def shm():
    import multiprocessing
    multiprocessing.Lock()
tr("secret", lambda: read(secret))
tr("write", lambda: write(target))
tr("state", lambda: write(os.environ["FIRSTMATE_EXTENSION_STATE"] + "/probe"))
tr("tmp", tmp)
tr("devnull", lambda: write("/dev/null"))
tr("tcp", tcp)
tr("kill", lambda: os.kill(pid, 0))
tr("etc", lambda: read("/etc/hostname"))
tr("shm", shm)
sys.stdout.write(" ".join(out))
