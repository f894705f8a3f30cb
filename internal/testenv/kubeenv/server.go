// Package kubeenv hands tests a real Kubernetes API server: a kube-apiserver and its
// etcd, built from their Go modules (internal/testenv/kubebin) and started once per test process on
// loopback, with a certificate authority of their own. Nothing accepts an
// unauthenticated connection: etcd wants the API server's client certificate, the API
// server wants a client certificate signed by the same CA or a service account token
// (anonymous requests are refused), and authorizes with RBAC.
//
// There is no kubelet, scheduler or controller manager. Kubelet (kubelet.go) plays the
// parts the tests need for one namespace: it binds Pods to a node, writes their status
// through the status subresource, binds claims, makes volume snapshots ready and
// releases claims no Pod uses any more.
//
// It is a package of its own, beside testenv, so that only the tests that need a
// cluster link client-go's informers and the dynamic client.
package kubeenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/space-sandbox/space/internal/testenv"
	"github.com/space-sandbox/space/internal/testenv/kubebin"
)

const (
	// startTimeout bounds the start of both servers: etcd answers in a second, the API
	// server installs every built-in API and runs its bootstrap hooks (RBAC roles,
	// priority classes) in 5 to 20 seconds on a loaded 2-core machine.
	startTimeout = 3 * time.Minute
	// dirPrefix names the temporary directory of one process's servers; a later
	// process removes those whose owner is gone (removeLeftovers).
	dirPrefix = "space-kubeenv-"
	// DefaultStorageClass is the cluster's default StorageClass, which the claims of
	// the tests get when they name none. Its volumes bind when a Pod first uses them
	// (WaitForFirstConsumer), as most cloud classes do.
	DefaultStorageClass = "standard"
	// SnapshotClass is a VolumeSnapshotClass whose snapshots Kubelet makes ready.
	SnapshotClass = "kubeenv-snapshots"
	// fakeDriver is the provisioner of DefaultStorageClass and the driver of
	// SnapshotClass: nothing runs it but Kubelet.
	fakeDriver = "kubeenv.space.dev"
	// NodeName is the node Kubelet binds Pods to.
	NodeName = "kubeenv-node"
)

// Server is the test process's API server.
type Server struct {
	// URL is https://127.0.0.1:<port>.
	URL string
	// Config authenticates as the cluster's administrator (a client certificate in
	// the group system:masters). Each call of RESTConfig returns a copy.
	config *rest.Config
	// Kubeconfig is a kubeconfig file of the administrator, with the CA and the key
	// inside it.
	Kubeconfig string
	// Clientset and Dynamic are clients of the administrator.
	Clientset kubernetes.Interface
	Dynamic   dynamic.Interface
	// Version is the kube-apiserver module version it was built from.
	Version string

	caPEM []byte
	dir   string
	crds  sync.Map // source name -> *crdOnce

	fleet     fleetOnce // the kube-scheduler and kwok of StartFleet
	fleetLogs []string
}

var (
	startOnce sync.Once
	started   *Server
	startErr  error
)

// Start returns the process's API server, starting it (and building its binaries,
// when this machine has never built them) the first time it is asked for. A failure
// fails the test with the command that builds the binaries: it is never skipped.
func Start(t testing.TB) *Server {
	t.Helper()
	startOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), kubebin.BuildTimeout+startTimeout)
		defer cancel()
		started, startErr = start(ctx)
	})
	if startErr != nil {
		t.Fatalf("kube-apiserver for the tests: %v\n(the binaries are built with\n\t%s)", startErr, kubebin.BuildCommand)
	}
	return started
}

// Launch starts an API server and its etcd for a program that is no test (the bench),
// building the binaries when this machine has never built them. Every call starts a
// pair of its own; they die with the process.
func Launch(ctx context.Context) (*Server, error) { return start(ctx) }

// RESTConfig returns a copy of the administrator's client configuration.
func (s *Server) RESTConfig() *rest.Config { return rest.CopyConfig(s.config) }

func start(ctx context.Context) (*Server, error) {
	bins, err := kubebin.FindOrBuild(ctx, func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "kubeenv: "+format+"\n", args...)
	})
	if err != nil {
		return nil, err
	}
	removeLeftovers()
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	// Ports are found free and then listened on by another process: two attempts
	// cover the rare port taken in between.
	var s *Server
	for attempt := range 2 {
		s, err = startServers(ctx, bins, filepath.Join(dir, strconv.Itoa(attempt)))
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if err := s.bootstrap(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func startServers(ctx context.Context, bins kubebin.Binaries, dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := newPKI(dir)
	if err != nil {
		return nil, err
	}
	etcdCert, err := ca.server("etcd")
	if err != nil {
		return nil, err
	}
	apiCert, err := ca.server("kube-apiserver")
	if err != nil {
		return nil, err
	}
	etcdClient, err := ca.client("apiserver-etcd-client", "kube-apiserver-etcd-client")
	if err != nil {
		return nil, err
	}
	admin, err := ca.client("admin", "kubeenv-admin", "system:masters")
	if err != nil {
		return nil, err
	}
	saPub, saKey, err := ca.serviceAccountKeys()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientURL := "https://127.0.0.1:" + ports[0]
	peerURL := "https://127.0.0.1:" + ports[1]

	etcd, err := spawn(ctx, filepath.Join(dir, "etcd.log"), bins.Etcd,
		"--name=kubeenv",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubeenv="+peerURL,
		"--cert-file="+etcdCert.certFile, "--key-file="+etcdCert.keyFile,
		"--client-cert-auth", "--trusted-ca-file="+ca.caFile,
		"--peer-cert-file="+etcdCert.certFile, "--peer-key-file="+etcdCert.keyFile,
		"--peer-client-cert-auth", "--peer-trusted-ca-file="+ca.caFile,
		// A test's data does not outlive its process: fsync would only slow every
		// write down on a disk the whole suite shares.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}

	apiPort := ports[2]
	apiserver, err := spawn(ctx, filepath.Join(dir, "kube-apiserver.log"), bins.APIServer,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+apiPort,
		"--tls-cert-file="+apiCert.certFile, "--tls-private-key-file="+apiCert.keyFile,
		"--client-ca-file="+ca.caFile,
		"--anonymous-auth=false",
		"--authorization-mode=RBAC",
		"--etcd-servers="+clientURL,
		"--etcd-cafile="+ca.caFile, "--etcd-certfile="+etcdClient.certFile, "--etcd-keyfile="+etcdClient.keyFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// The endpoint reconciler would publish the advertise address in the
		// "kubernetes" Service's endpoints, and refuses a loopback one: nothing in the
		// tests reaches the API server through a Service.
		"--endpoint-reconciler-type=none",
		// Pods are watched from etcd itself, not the watch cache, and etcd is
		// compacted every 10s (the default is 5m): a watch of Pods from an old
		// resourceVersion then meets 410 Gone within seconds, as one reconnecting
		// after a long outage does in a cluster (WaitCompacted). A cache initialised on
		// this fresh etcd would replay from revision 1 instead.
		"--watch-cache-sizes=pods#0",
		"--etcd-compaction-interval=10s",
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--profiling=false",
		// API Priority and Fairness stays on, as in every cluster: its seats are what a
		// fleet's requests must stay within (apiserver_flowcontrol_rejected_requests_total,
		// read by Counters), and its queues are what a burst of creates meets.
		"--v=1",
	)
	if err != nil {
		etcd.stop()
		return nil, err
	}

	cfg := &rest.Config{
		Host: "https://127.0.0.1:" + apiPort,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: ca.pem, CertData: admin.certPEM, KeyData: admin.keyPEM,
		},
		// Tests create Pods, claims and namespaces in bursts; client-go's default of
		// 5 per second would make the client their bottleneck.
		QPS: 500, Burst: 1000,
		UserAgent: "space-kubeenv",
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube client: %w", err)
	}
	if err := waitReady(ctx, cs, etcd, apiserver); err != nil {
		apiserver.stop()
		etcd.stop()
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	s := &Server{URL: cfg.Host, config: cfg, Clientset: cs, Dynamic: dyn, Version: bins.APIServerVersion, caPEM: ca.pem, dir: dir}
	s.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := writeKubeconfig(s.Kubeconfig, s.URL, ca.pem, "default", clientcmdapi.AuthInfo{
		ClientCertificateData: admin.certPEM, ClientKeyData: admin.keyPEM,
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// waitReady waits until the API server answers /readyz, or one of the servers exits.
func waitReady(ctx context.Context, cs kubernetes.Interface, procs ...*process) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var last error
	for {
		for _, p := range procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited at start: %v; its log %s ends:\n%s", p.name, p.err, p.log, tail(p.log))
			default:
			}
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready within %s (last: %v); its log %s ends:\n%s", startTimeout, last, procs[len(procs)-1].log, tail(procs[len(procs)-1].log))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// bootstrap creates what a cluster's controllers and its installer would have: the
// default StorageClass, the VolumeSnapshot CRDs and a VolumeSnapshotClass.
func (s *Server) bootstrap(ctx context.Context) error {
	bindLater := storagev1.VolumeBindingWaitForFirstConsumer
	deleteVolumes := corev1.PersistentVolumeReclaimDelete
	_, err := s.Clientset.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        DefaultStorageClass,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       fakeDriver,
		VolumeBindingMode: &bindLater,
		ReclaimPolicy:     &deleteVolumes,
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("default storage class: %w", err)
	}
	if err := s.installCRDs(ctx, SnapshotCRDs); err != nil {
		return err
	}
	return s.createSnapshotClass(ctx)
}

// WaitCompacted waits until the server answers a watch of Pods from resourceVersion rv
// with 410 Gone (the API server compacts etcd every 10 seconds, up to the revision of
// the round before): a test of what follows an expired watch starts from there.
func (s *Server) WaitCompacted(t testing.TB, rv string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		err := s.watchError(ctx, rv)
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("a watch from resourceVersion %s is still served after a minute (last: %v)", rv, err)
		}
	}
}

// watchError opens a watch of Pods from rv and returns the error it ends with within a
// second, if any.
func (s *Server) watchError(ctx context.Context, rv string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	w, err := s.Clientset.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == "ERROR" {
			return apierrors.FromObject(ev.Object)
		}
	}
	return ctx.Err()
}

// RequireCRDs installs the CRDs of src (once per process) and fails the test when
// they cannot be installed.
func (s *Server) RequireCRDs(t testing.TB, src CRDSource) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := s.installCRDs(ctx, src); err != nil {
		t.Fatalf("install the CRDs of %s: %v", src.Module, err)
	}
}

// writeKubeconfig writes a kubeconfig of one cluster, one user and namespace as the
// context's namespace.
func writeKubeconfig(path, server string, caPEM []byte, namespace string, user clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeenv"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["user"] = &user
	cfg.Contexts["kubeenv"] = &clientcmdapi.Context{Cluster: "kubeenv", AuthInfo: "user", Namespace: namespace}
	cfg.CurrentContext = "kubeenv"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// Namespace creates a namespace of the test's own, with the "default" service
// account the controller manager would have made (the ServiceAccount admission plugin
// refuses Pods in a namespace without it). Namespaces are not deleted: without the
// controller manager a deleted namespace stays Terminating, and the server goes away
// with the process.
func (s *Server) Namespace(t testing.TB) string {
	t.Helper()
	name, err := s.CreateNamespace(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// CreateNamespace is Namespace for a program that is no test.
func (s *Server) CreateNamespace(ctx context.Context) (string, error) {
	name := "t-" + strings.ToLower(testenv.RandomID(5))
	if _, err := s.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create namespace: %w", err)
	}
	if _, err := s.Clientset.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create the default service account: %w", err)
	}
	return name, nil
}

// ServiceAccountToken returns a token of the service account namespace/name (it must
// exist), issued by the API server's TokenRequest API for an hour.
func (s *Server) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	hour := int64(3600)
	tr, err := s.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(testenv.Context(t), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of service account %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// TokenConfig is a client configuration that authenticates with token alone.
func (s *Server) TokenConfig(token string) *rest.Config {
	return &rest.Config{Host: s.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: s.caPEM}, QPS: 200, Burst: 400}
}

// TokenKubeconfig writes a kubeconfig file (in a temporary directory of the test) that
// authenticates with token and has namespace as its context's namespace.
func (s *Server) TokenKubeconfig(t testing.TB, namespace, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := writeKubeconfig(path, s.URL, s.caPEM, namespace, clientcmdapi.AuthInfo{Token: token}); err != nil {
		t.Fatal(err)
	}
	return path
}

// process is one server child process.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (p *process) stop() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// spawnRequests are served by one goroutine locked to its OS thread for the life of
// the process: children are started with Pdeathsig, which the kernel sends when the
// thread that started them ends, so they must be started by a thread that never does.
// Then a test process that exits, panics or is killed by go test's timeout takes its
// servers with it.
var (
	spawnOnce     sync.Once
	spawnRequests = make(chan spawnRequest)
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func spawn(ctx context.Context, logPath, bin string, args ...string) (*process, error) {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawnRequests {
				r.done <- r.cmd.Start()
			}
		}()
	})
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	req := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	select {
	case spawnRequests <- req:
	case <-ctx.Done():
		logFile.Close()
		return nil, ctx.Err()
	}
	if err := <-req.done; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &process{name: filepath.Base(bin), log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// freePorts returns n loopback ports nobody listened on a moment ago, all distinct.
func freePorts(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free loopback port: %w", err)
		}
		lns = append(lns, ln)
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		ports = append(ports, port)
	}
	return ports, nil
}

// removeLeftovers removes the server directories of test processes that are gone
// (killed before they could clean up: their children died with them, their files did
// not).
func removeLeftovers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// tail returns the last lines of a log file.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	const max = 3000
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}
