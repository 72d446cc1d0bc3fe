package kubebackend

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	rbacclient "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// shippedRole reads the Role that deploy/kubernetes/rbac.yaml ships.
func shippedRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	data, err := os.ReadFile("../../deploy/kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var role rbacv1.Role
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
			t.Fatal(err)
		}
		if role.Kind == "Role" {
			return &role
		}
	}
	t.Fatal("deploy/kubernetes/rbac.yaml has no Role")
	return nil
}

// grant gives user the shipped Role, less the verbs in without, in namespace default, and
// returns once the API server's authorizer answers as the new Role says: it learns of a
// Role from a watch a moment after the write, and a request in between is refused.
func grant(t *testing.T, srv *kubetest.Server, user string, without ...string) {
	t.Helper()
	rc, _, err := RESTConfig(srv.Kubeconfig(t, "admin", "default", ""))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := rbacclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	role := shippedRole(t)
	role.Namespace = "default"
	for i := range role.Rules {
		role.Rules[i].Verbs = slices.DeleteFunc(role.Rules[i].Verbs, func(v string) bool { return slices.Contains(without, v) })
	}
	cs.Roles("default").Delete(ctx, role.Name, metav1.DeleteOptions{})
	if _, err := cs.Roles("default").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}},
	}
	cs.RoleBindings("default").Delete(ctx, binding.Name, metav1.DeleteOptions{})
	if _, err := cs.RoleBindings("default").Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reviews, err := authorizationclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range shippedRole(t).Rules {
		for _, verb := range rule.Verbs {
			waitUntilAuthorized(t, reviews, user, rule, verb, !slices.Contains(without, verb))
		}
	}
}

// waitUntilAuthorized waits until the authorizer's answer to user doing verb on rule's
// resource is want.
func waitUntilAuthorized(t *testing.T, reviews authorizationclient.AuthorizationV1Interface, user string, rule rbacv1.PolicyRule, verb string, want bool) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, func() error {
		review, err := reviews.SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: "default", Verb: verb, Group: rule.APIGroups[0], Resource: rule.Resources[0],
			},
		}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if review.Status.Allowed != want {
			return fmt.Errorf("the authorizer says %q is allowed: %v, want %v", verb, review.Status.Allowed, want)
		}
		return nil
	}, func(err error) bool { return err == nil })
}

// TestLeastRBAC runs the conformance suite as a user that has only the shipped Role, then
// takes each of its verbs away and checks that the request needing it fails with an error
// that names it.
func TestLeastRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := kubetest.Start(t, kubetest.Options{RBAC: true})
	kubeconfig := srv.Kubeconfig(t, "caddy", "default", "")
	grant(t, srv, "caddy")
	var n atomic.Int64
	t.Run("conformance_with_the_role", func(t *testing.T) {
		electortest.Run(t, func(t *testing.T) electortest.Harness {
			return electortest.Harness{
				NewClient: func(t *testing.T) elector.Backend {
					b, err := New(Config{Kubeconfig: kubeconfig})
					if err != nil {
						t.Fatal(err)
					}
					return b
				},
				TTL:      2 * time.Second,
				Advance:  time.Sleep,
				Election: func() string { return fmt.Sprintf("rbac-%d", n.Add(1)) },
			}
		})
	})

	ctx := context.Background()
	for _, tc := range []struct {
		verb string
		try  func(b *Backend) error
	}{
		{"create", func(b *Backend) error { _, _, err := b.Grant(ctx, 5*time.Second); return err }},
		{"list", func(b *Backend) error { _, err := b.Observe(ctx, "rbac"); return err }},
		{"get", func(b *Backend) error { _, err := b.History(ctx, "rbac"); return err }},
		{"delete", func(b *Backend) error { return b.ClearIntent(ctx, "rbac", nil) }},
		{"update", func(b *Backend) error { return b.AppendHistory(ctx, "rbac", []byte("x"), 5) }},
		{"watch", func(b *Backend) error {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			o := <-b.Watch(wctx, "rbac", 1)
			return o.Err
		}},
	} {
		t.Run("without_"+tc.verb, func(t *testing.T) {
			if tc.verb == "update" {
				// An update needs the object to exist: write the history once first.
				grant(t, srv, "caddy")
				b, _ := New(Config{Kubeconfig: kubeconfig})
				waitFor(t, func() error { return b.AppendHistory(ctx, "rbac", []byte("x"), 5) }, func(err error) bool { return err == nil })
				b.Close()
			}
			grant(t, srv, "caddy", tc.verb)
			b, err := New(Config{Kubeconfig: kubeconfig})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			want := fmt.Sprintf("grant the verb %q", tc.verb)
			// The authorizer learns of the new Role a moment after it is written.
			err = waitFor(t, func() error { return tc.try(b) }, func(err error) bool { return err != nil && strings.Contains(err.Error(), want) })
			if !strings.Contains(err.Error(), "cannot "+tc.verb+" resource \"leases\"") {
				t.Errorf("the API server's own words are lost: %v", err)
			}
		})
	}
}

// waitFor calls try until done accepts its error, for up to 10s, and returns that error.
func waitFor(t *testing.T, try func() error, done func(error) bool) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := try()
		if done(err) {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after 10s", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
