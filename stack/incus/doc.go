// Package incus is a small client for the Incus REST API over incusd's unix
// socket. It covers what box and drill need (instances, exec, files,
// snapshots, backups, networks, ACLs, profiles, projects, storage pools,
// images, image servers (the incus CLI's remotes), instance templates and
// operations) and nothing box-specific. It does not use
// github.com/lxc/incus/v6, which is not to be depended on here (see
// docs/design.md, "Where things live").
//
// # Prerequisites
//
// A running incusd, and a user allowed to open its socket: root, or a
// member of the incus-admin group for the full API. Members of the incus
// group get the restricted socket (unix.socket.user, one project per user);
// point New at it, or at $INCUS_SOCKET.
//
// # Socket and project
//
// New("") dials DefaultSocket(): $INCUS_SOCKET, else $INCUS_DIR/unix.socket,
// else /var/lib/incus/unix.socket. New never dials; the first call does, and
// a daemon that is not there is an *UnreachableError naming the socket and
// saying what to check. Requests go to http://incus/1.0/... on that socket.
//
// Every request is in the server's default project unless the client was
// scoped with Project, which returns a copy:
//
//	c := incus.New("").Project("box-alice")
//
// # Operations and deadlines
//
// Incus runs slow work as background operations. Every method that changes
// something waits for its operation before returning, whether Incus answered
// sync or async, so callers never see one. The context bounds the whole call,
// the wait included; when it ends first the error wraps ctx.Err() (test it
// with errors.Is(err, context.DeadlineExceeded)), names the operation, and
// the client has asked Incus to cancel it. Exec has a default deadline of
// DefaultExecTimeout when the context has none.
//
// # Images from image servers
//
// An image named REMOTE:ALIAS (images:debian/12/cloud) is not fetched by
// this client: the create asks incusd to pull it from the image server
// itself (InstanceSource with Server, Protocol "simplestreams", Mode
// "pull", Alias and the server's pinned Certificate), and incusd caches
// it; a second create from it downloads nothing. Remote.PullSource builds
// that source. The remotes are the incus CLI's own: LoadRemotes reads
// config.yml in its config directory (ConfigDir: $INCUS_CONF, else
// $HOME/.config/incus), each remote's pinned certificate in
// servercerts/NAME.crt; without that file they are DefaultRemotes, where
// images is the public simplestreams server (ImagesServer) and local this
// server. local:NAME, or a NAME without a remote, is an image on this
// server. A remote of the incus protocol (another Incus) or any other is
// refused for now, with the fix: copy the image here first.
//
// While incusd pulls, it reports the download in the create operation's
// metadata under DownloadProgress ("download_progress": "rootfs: 45%
// (12.34MB/s)"), then the unpacking under another "*_progress" key;
// Instances().CreateWithProgress reads the operation every half second and
// passes each new line on (ProgressText). When the server cannot be
// reached and incusd never fetched its index, the operation fails before
// any instance exists, with incusd's own text, e.g. (6.0.4, measured):
//
//	Failed getting remote image info: Failed getting image: Failed parsing stream:
//	Get "https://203.0.113.10:8443/streams/v1/index.json": Unable to connect to:
//	203.0.113.10:8443 ([dial tcp 203.0.113.10:8443: connect: connection refused])
//
// With the server down but its index and the image cached (incusd keeps
// the index an hour, and, read in its source, uses an older copy when the
// server does not answer), incusd creates from its cache: nothing here
// asks the server.
//
// # Errors
//
// Errors are typed and wrapped with what was being done:
//
//   - *StatusError: incusd refused the request (Code is the HTTP status).
//     IsNotFound (404), IsConflict (409 only), IsPreconditionFailed (412,
//     a stale ETag) and IsAlreadyExists (which also knows the create calls
//     for which Incus does not answer 409) test for the common cases.
//   - *OperationError: the request was accepted but its operation ended in
//     Failure or was Cancelled; Message is Incus's reason.
//   - *UnreachableError: nothing is listening on the socket, or this user
//     may not open it (IsUnreachable).
//   - *MalformedError: the answer was not an Incus response.
//
// # Example
//
// Launch a container from a local image, run a command in it, and delete
// it:
//
//	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
//	defer cancel()
//
//	c := incus.New("") // $INCUS_SOCKET or /var/lib/incus/unix.socket
//	srv, err := c.Server(ctx)
//	if err != nil {
//		return err // e.g. "incus: cannot reach incusd at ...: is incusd running ...?"
//	}
//	typ := "container"
//	if srv.CanRunVMs() {
//		typ = "virtual-machine"
//	}
//
//	insts := c.Instances() // the instances part of the API; Networks, Images, Storage, Projects likewise
//	err = insts.Create(ctx, incus.InstancesPost{
//		Name:   "demo",
//		Type:   typ,
//		Source: incus.InstanceSource{Type: "image", Alias: "debian/12"},
//		Config: map[string]string{"user.box": "1"},
//		Start:  true,
//	})
//	if incus.IsAlreadyExists(err) {
//		return fmt.Errorf("demo exists already; delete it first: %w", err)
//	} else if err != nil {
//		return err
//	}
//
//	res, err := insts.Exec(ctx, "demo", incus.ExecRequest{
//		Command: []string{"sh", "-c", "echo hello; uname -r >&2"},
//		Env:     map[string]string{"LANG": "C.UTF-8"},
//	})
//	if err != nil {
//		return err
//	}
//	fmt.Printf("exit %d, stdout %q, stderr %q\n", res.ExitCode, res.Stdout, res.Stderr)
//
//	mine, err := insts.List(ctx, map[string]string{"user.box": "1"}) // filtered by the server
//	if err != nil {
//		return err
//	}
//	_ = mine
//
//	// Incus will not delete a running instance.
//	if err := insts.SetState(ctx, "demo", "stop", 0, true); err != nil {
//		return err
//	}
//	if err := insts.Delete(ctx, "demo"); err != nil && !incus.IsNotFound(err) {
//		return err
//	}
//
// # Tests
//
// The package's unit tests need neither root nor incusd: they run against
// the fake server in the incustest subpackage, which other packages can use
// too.
//
//	go test -race ./stack/incus/...
package incus
