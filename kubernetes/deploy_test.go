package kubernetes

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/caddyleader/caddy-leader/internal/testkit/goldentest"
)

// documents decodes each YAML document of a file under deploy/kubernetes into a new T
// when its kind is kind.
func documents[T any](t *testing.T, file, kind string) []*T {
	t.Helper()
	data, err := os.ReadFile("../deploy/kubernetes/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var out []*T
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if meta.Kind != kind {
			continue
		}
		v := new(T)
		if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
			t.Fatalf("%s: %s: %v", file, kind, err)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no %s", file, kind)
	}
	return out
}

// TestDeployManifests checks what the root module's deploy tests cannot: that the
// ConfigMap's Caddyfile adapts with this store, and that the pods run as the ServiceAccount
// that rbac.yaml grants the Role to (RBAC itself is exercised by kubebackend's TestLeastRBAC).
func TestDeployManifests(t *testing.T) {
	cm := documents[corev1.ConfigMap](t, "configmap.yaml", "ConfigMap")[0]
	t.Setenv("HOSTNAME", "caddy-leader-0")
	t.Setenv("ADVERTISE_URL", "http://10.0.0.5:8080")
	js, warnings, err := goldentest.Adapt(t, cm.Data["Caddyfile"])
	if err != nil || len(warnings) > 0 {
		t.Fatalf("the ConfigMap's Caddyfile: %v %v", err, warnings)
	}
	var config struct {
		Apps struct {
			Leader struct {
				Store map[string]any
			}
		}
	}
	if err := json.Unmarshal(js, &config); err != nil {
		t.Fatal(err)
	}
	if s := config.Apps.Leader.Store; s["module"] != "kubernetes" || s["namespace"] != "{env.POD_NAMESPACE}" || s["kubeconfig"] != nil {
		t.Errorf("store %v, want kubernetes in the pod's namespace with its service account", s)
	}

	set := documents[appsv1.StatefulSet](t, "statefulset.yaml", "StatefulSet")[0]
	sa := documents[corev1.ServiceAccount](t, "rbac.yaml", "ServiceAccount")[0]
	role := documents[rbacv1.Role](t, "rbac.yaml", "Role")[0]
	binding := documents[rbacv1.RoleBinding](t, "rbac.yaml", "RoleBinding")[0]
	if set.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("the pods run as %q, rbac.yaml's ServiceAccount is %q", set.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Kind != "ServiceAccount" || binding.Subjects[0].Name != sa.Name {
		t.Errorf("the RoleBinding binds %v to %v, want Role %s to ServiceAccount %s", binding.RoleRef, binding.Subjects, role.Name, sa.Name)
	}
	for _, r := range role.Rules {
		if strings.Join(r.APIGroups, ",") != "coordination.k8s.io" || strings.Join(r.Resources, ",") != "leases" || len(r.ResourceNames) > 0 {
			t.Errorf("rule %+v reaches beyond leases", r)
		}
	}
	var pod = set.Spec.Template.Spec
	var ns bool
	for _, c := range pod.Containers {
		for _, e := range c.Env {
			ns = ns || e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
			if strings.HasPrefix(e.Name, "ETCD") {
				t.Errorf("%s: an etcd setting, %s, is left", c.Name, e.Name)
			}
		}
	}
	if !ns {
		t.Error("no container gets POD_NAMESPACE from metadata.namespace")
	}
}
