"""partition.py - the fault suite's network partitions (tests/faults/README.md):
the services in network namespaces (Netns: ip netns + veth, routes and
links changed and healed), and the userspace relay (Proxy) used where
namespaces cannot be made.  Used by tests/faults/run."""
import json, os, signal, socket, subprocess, threading, time


def log(msg):
    print('[%s] %s' % (time.strftime('%H:%M:%S'), msg), flush=True)


# ---------------------------------------------------------------- fault proxy
class Proxy:
    """A TCP relay in front of one tcd node.  partition(): stop relaying in
    both directions ('blackhole': bytes wait, as in a short network outage)
    or reset every connection and refuse new ones ('reset')."""

    def __init__(self, upstream):
        self.up = upstream
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(('127.0.0.1', 0))
        self.ls.listen(128)
        self.addr = '127.0.0.1:%d' % self.ls.getsockname()[1]
        self.mode = None
        self.conns = []
        self.lock = threading.Lock()
        self.stop = False
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stop:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            if self.mode == 'reset':
                c.close()
                continue
            try:
                h, p = self.up.rsplit(':', 1)
                u = socket.create_connection((h, int(p)), timeout=3)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            threading.Thread(target=self.pump, args=(c, u), daemon=True).start()
            threading.Thread(target=self.pump, args=(u, c), daemon=True).start()

    def pump(self, a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                while self.mode == 'blackhole' and not self.stop:
                    time.sleep(0.05)
                if self.mode == 'reset':
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def partition(self, mode):
        self.mode = mode
        if mode == 'reset':
            with self.lock:
                for s in self.conns:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                self.conns = []

    def heal(self):
        self.mode = None

    def close(self):
        self.stop = True
        self.mode = None
        self.ls.close()


# ---------------------------------------------------------------- network namespaces
NETNS_PREFIX = 'txcf'  # txcf<driver pid>o / ...s: netns; ...oh / ...sh: the host side of their veth
NETNS_STATE_DIR = '/run/txcf'  # <driver pid>.json: what a driver created (for the stale clean-up)
SINK_MAC = '02:00:5e:00:00:fe'  # a MAC nobody has: frames sent to it are dropped by the receiver


class NetnsUnavailable(Exception):
    pass


def ip_cmd(*args, check=True):
    try:
        p = subprocess.run(['ip'] + [str(a) for a in args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        if check:
            raise RuntimeError('ip %s: %s' % (' '.join(map(str, args)), e))
        return None
    if check and p.returncode != 0:
        raise RuntimeError('ip %s: %s' % (' '.join(map(str, args)), p.stderr.strip()[-300:]))
    return p


def driver_alive(pid):
    """Whether pid is a running fault driver (this script), not a reused pid."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return b'faults/run' in f.read()
    except OSError:
        return False


def netns_stale_cleanup(own_pid):
    """Remove what drivers that are gone left behind (a killed run): their
    namespaces (and the processes still in them), veths, host routes."""
    import re
    pids = set()
    p = ip_cmd('netns', 'list', check=False)
    for line in (p.stdout if p and p.returncode == 0 else '').splitlines():
        m = re.match(r'%s(\d+)[os]\b' % NETNS_PREFIX, line)
        if m:
            pids.add(int(m.group(1)))
    p = ip_cmd('-o', 'link', 'show', check=False)
    for line in (p.stdout if p and p.returncode == 0 else '').splitlines():
        m = re.match(r'\d+: %s(\d+)[os]h[@:]' % NETNS_PREFIX, line)
        if m:
            pids.add(int(m.group(1)))
    try:
        for f in os.listdir(NETNS_STATE_DIR):
            if f.endswith('.json') and f[:-5].isdigit():
                pids.add(int(f[:-5]))
    except OSError:
        pass
    for pid in sorted(pids):
        # our own pid: nothing is ours yet, so it is a dead driver's with a reused pid
        if pid != own_pid and driver_alive(pid):
            continue
        log('  netns: removing the leftovers of driver %d (gone)' % pid)
        Netns(pid).teardown()


class Netns:
    """One network namespace per service (partition, tests/faults/README.md).

    A private 10.X.Y.0/24 per run (X, Y from the driver's pid; one that any
    address or route of the host overlaps is skipped).  Service i (order 0,
    stock 1), b = 8*i:
      host veth NS+'h'   N.b+1/29  PostgreSQL and Redis ("data" address),
                                   the netns's gateway (to the other netns)
                         N.64+b+1/32  the tcd nodes ("TC" address)
      netns veth0        N.b+2/29  the service listens here
                         N.b+4/32  source of its connections to the TC
      N.b+3: nobody; the 'drop' mode routes through it with a permanent
      neighbour entry of a MAC nobody has (frames leave and are lost).
    A blackhole route for the /24 in the host catches what a downed veth
    would otherwise send out of the default route.  Forwarding is switched on
    for the two host veths only (order-service -> stock-service through the
    host); no global sysctl is changed."""

    SVCS = (('order-service', 'o'), ('stock-service', 's'))

    def __init__(self, pid):
        self.pid = pid
        self.net = None
        self.svc = {}
        for i, (name, c) in enumerate(self.SVCS):
            self.svc[name] = {'ns': '%s%d%s' % (NETNS_PREFIX, pid, c), 'hveth': '%s%d%sh' % (NETNS_PREFIX, pid, c),
                              'b': 8 * i}
        self.state_file = os.path.join(NETNS_STATE_DIR, '%d.json' % pid)
        self.partitioned = None

    def addr(self, name, off):
        return '%s.%d' % (self.net, self.svc[name]['b'] + off)

    def data_addr(self, name):
        return self.addr(name, 1)

    def tc_addr(self, name):
        return self.addr(name, 65)

    def svc_addr(self, name):
        return self.addr(name, 2)

    def extra_listen(self):
        """TXC_EXTRA_LISTEN for cluster/local/up: the data addresses (pg_hba:
        their /29) and the TC addresses."""
        out = []
        for name, _ in self.SVCS:
            out += ['%s/29' % self.data_addr(name), self.tc_addr(name)]
        return ' '.join(out)

    def pick_net(self):
        import ipaddress
        used = []
        for args in (('-o', '-4', 'addr', 'show'), ('-4', 'route', 'show', 'table', 'all')):
            for line in ip_cmd(*args).stdout.splitlines():
                for tok in line.split():
                    try:
                        if tok[0].isdigit() and '.' in tok:
                            used.append(ipaddress.ip_network(tok, strict=False))
                    except ValueError:
                        pass
        for attempt in range(256):
            idx = (self.pid + attempt * 97) % 32768
            cand = ipaddress.ip_network('10.%d.%d.0/24' % (128 + idx // 256, idx % 256))
            if not any(cand.overlaps(u) for u in used if u.prefixlen > 0):
                return '10.%d.%d' % (128 + idx // 256, idx % 256)
        raise RuntimeError('no free 10.128-255.x.0/24 for the namespaces')

    def save_state(self):
        os.makedirs(NETNS_STATE_DIR, exist_ok=True)
        with open(self.state_file + '.tmp', 'w') as f:
            json.dump({'net': self.net, 'netns': [s['ns'] for s in self.svc.values()]}, f)
        os.replace(self.state_file + '.tmp', self.state_file)

    def setup(self):
        """Raises NetnsUnavailable if namespaces cannot be made here."""
        first = self.svc['order-service']['ns']
        p = ip_cmd('netns', 'add', first, check=False)
        if p is None or p.returncode != 0:
            raise NetnsUnavailable('ip netns add: %s' % (p.stderr.strip() if p else 'ip not found'))
        try:
            self.net = self.pick_net()
            self.save_state()
            for name, _ in self.SVCS:
                s = self.svc[name]
                if name != 'order-service':
                    ip_cmd('netns', 'add', s['ns'])
                ip_cmd('link', 'add', s['hveth'], 'type', 'veth', 'peer', 'name', 'veth0', 'netns', s['ns'])
                ip_cmd('addr', 'add', self.data_addr(name) + '/29', 'dev', s['hveth'])
                ip_cmd('addr', 'add', self.tc_addr(name) + '/32', 'dev', s['hveth'])
                with open('/proc/sys/net/ipv4/conf/%s/forwarding' % s['hveth'], 'w') as f:
                    f.write('1\n')
                ip_cmd('link', 'set', s['hveth'], 'up')
                ns = s['ns']
                ip_cmd('-n', ns, 'link', 'set', 'lo', 'up')
                ip_cmd('-n', ns, 'addr', 'add', self.svc_addr(name) + '/29', 'dev', 'veth0')
                ip_cmd('-n', ns, 'addr', 'add', self.addr(name, 4) + '/32', 'dev', 'veth0')
                ip_cmd('-n', ns, 'link', 'set', 'veth0', 'up')
                self.routes(name)
            ip_cmd('route', 'add', 'blackhole', self.net + '.0/24')
            # order-service -> stock-service is forwarded by the host
            o, s = 'order-service', 'stock-service'
            p = ip_cmd('route', 'get', self.svc_addr(s), 'from', self.svc_addr(o), 'iif',
                       self.svc[o]['hveth'], check=False)
            if p.returncode != 0 or self.svc[s]['hveth'] not in p.stdout:
                raise RuntimeError('the host does not forward between the veths: %s' % (p.stderr or p.stdout).strip())
        except Exception as e:
            self.teardown()
            raise NetnsUnavailable('setting up the namespaces failed: %s' % e)

    def routes(self, name):
        """The netns's normal routes (also after a link was down)."""
        ns = self.svc[name]['ns']
        ip_cmd('-n', ns, 'route', 'replace', 'default', 'via', self.data_addr(name))
        ip_cmd('-n', ns, 'route', 'replace', self.tc_addr(name) + '/32', 'via', self.data_addr(name), 'src',
               self.addr(name, 4))

    def wait_link_up(self, name, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            p = ip_cmd('-o', 'link', 'show', self.svc[name]['hveth'], check=False)
            if p and 'LOWER_UP' in p.stdout and 'state UP' in p.stdout:
                return True
            time.sleep(0.05)
        return False

    def partition(self, mode):
        kind, what = mode.split(':')
        self.partitioned = mode
        if mode == 'route:blackhole':
            for name, _ in self.SVCS:
                ip_cmd('-n', self.svc[name]['ns'], 'route', 'replace', 'blackhole', self.tc_addr(name) + '/32')
        elif mode == 'route:drop':
            for name, _ in self.SVCS:
                s, sink = self.svc[name], self.addr(name, 3)
                ip_cmd('-n', s['ns'], 'neigh', 'replace', sink, 'lladdr', SINK_MAC, 'dev', 'veth0', 'nud', 'permanent')
                ip_cmd('neigh', 'replace', sink, 'lladdr', SINK_MAC, 'dev', s['hveth'], 'nud', 'permanent')
                # service -> TC and TC -> service (its TC source address) through the sink
                ip_cmd('-n', s['ns'], 'route', 'replace', self.tc_addr(name) + '/32', 'via', sink, 'src',
                       self.addr(name, 4))
                ip_cmd('route', 'replace', self.addr(name, 4) + '/32', 'via', sink, 'dev', s['hveth'])
        elif kind == 'link':
            ip_cmd('link', 'set', self.svc[what]['hveth'], 'down')
        else:
            raise ValueError(mode)

    def heal(self):
        mode, self.partitioned = self.partitioned, None
        if mode is None:
            return
        kind, what = mode.split(':')
        if kind == 'route':
            for name, _ in self.SVCS:
                if mode == 'route:drop':
                    ip_cmd('route', 'del', self.addr(name, 4) + '/32', check=False)
                self.routes(name)
        else:
            s = self.svc[what]
            ip_cmd('link', 'set', s['hveth'], 'up')
            if not self.wait_link_up(what):
                raise RuntimeError('%s did not come up again' % s['hveth'])
            # link down drops no address, but check (and the routes inside)
            have = ip_cmd('-o', '-4', 'addr', 'show', 'dev', s['hveth']).stdout
            for a, plen in ((self.data_addr(what), 29), (self.tc_addr(what), 32)):
                if ' %s/%d ' % (a, plen) not in have:
                    ip_cmd('addr', 'add', '%s/%d' % (a, plen), 'dev', s['hveth'])
            subnet = '%s.%d/29' % (self.net, s['b'])
            if not ip_cmd('route', 'show', subnet, 'dev', s['hveth']).stdout.strip():
                ip_cmd('route', 'replace', subnet, 'dev', s['hveth'], 'proto', 'kernel', 'scope', 'link', 'src',
                       self.data_addr(what))
            self.routes(what)

    def teardown(self):
        """Everything of driver self.pid: processes left in the namespaces
        (SIGTERM, SIGKILL after 5 s), veths, namespaces, the /24 route."""
        net = self.net
        if net is None:
            try:
                with open(self.state_file) as f:
                    net = json.load(f).get('net')
            except (OSError, ValueError):
                pass
        left = []
        for s in self.svc.values():
            p = ip_cmd('netns', 'pids', s['ns'], check=False)
            if p and p.returncode == 0:
                left += [int(x) for x in p.stdout.split() if x.isdigit()]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in left:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            end = time.monotonic() + 5
            while time.monotonic() < end and any(os.path.exists('/proc/%d' % p) for p in left):
                time.sleep(0.05)
            left = [p for p in left if os.path.exists('/proc/%d' % p)]
            if not left:
                break
        for s in self.svc.values():
            ip_cmd('link', 'del', s['hveth'], check=False)
            ip_cmd('netns', 'del', s['ns'], check=False)
        if net:
            ip_cmd('route', 'del', 'blackhole', net + '.0/24', check=False)
        # the veths go with their namespace, asynchronously: wait for it
        end = time.monotonic() + 10
        while time.monotonic() < end:
            p = ip_cmd('-o', 'link', 'show', check=False)
            if not p or not any(s['hveth'] + '@' in p.stdout or s['hveth'] + ':' in p.stdout
                                for s in self.svc.values()):
                break
            time.sleep(0.05)
        try:
            os.unlink(self.state_file)
        except OSError:
            pass
